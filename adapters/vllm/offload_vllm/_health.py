"""Liveness and readiness answered off the event loop, on a port of their own.

`OFFLOAD_VLLM_HEALTH_PORT` starts a small process beside the API server
(`HealthServer`, which starts it again if it ends; what it runs is
`_health_answer.py`), listening on vLLM's
`--host` (all interfaces when vLLM has none, as vLLM binds), which answers two
paths from what the event loop last published (`HealthState`):

- `GET /health` (liveness): 200 while the loop turned within
  `OFFLOAD_VLLM_HEALTH_MAX_STALL` seconds and the engine's last check found it
  alive; else 503. A busy loop still turns (offload keeps it free), so a
  server under load stays alive to its probe; a loop blocked for real stops
  publishing, and is reported once the bound has passed.
- `GET /ready` (readiness): 503 while admission would refuse a request of
  the typical cost (of the requests priced at the seam) in the default lane, until it would admit twice
  that (`_admission.Readiness`), during shutdown (from SIGTERM until
  the process ends, while vLLM drains), and while liveness fails; else 200.

Both answer a JSON body: `status`, the `reason` of a 503, and the ages of
what they read. The loop's side (`keep_current`) is one task that wakes every
`PUBLISH_INTERVAL_S`: it writes the time it ran, whether admission refuses,
and, every `ENGINE_CHECK_INTERVAL_S`, the result of vLLM's own engine check
(the one vLLM's `/health` awaits), into a few bytes of shared memory. The
answering process reads only those bytes: it never touches the loop's
objects, and needs nothing of the API server's interpreter, so no thread
holding its GIL delays an answer (why a process and not a thread:
`_health_answer.py`). With `--api-server-count N` the port is the whole
server's: one answering process reads every API server process's board
(`_shared_board`), and answers 503 while any of them would.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Final, final

import anyio

import offload

from . import _health_answer, _shared_board
from ._admission import AdmissionListener, Priced, Readiness
from ._health_answer import Board, Snapshot
from ._lanes import DEFAULT_LANE
from ._metric_family import once_per_process
from ._options import BY_NAME
from ._parsers import OffloadVLLMConfigError
from ._seams import config as config_seam
from ._seams import engine as engine_seam

logger = logging.getLogger("vllm.offload_vllm")

#: How often the loop publishes its turn (and readiness, whose typical cost
#: decays with time): liveness is judged over seconds, and admission changes
#: are published at once (`Health.changed`), so a few wake-ups a second do.
#: An idle server's loop wakes for this and the lag sampler alone, so it
#: sets much of what an idle adapter server costs beside plain vLLM.
PUBLISH_INTERVAL_S = 0.25

#: How often the loop runs vLLM's engine check (a flag read on vLLM's
#: `AsyncLLM`): a dead engine is reported within this plus a probe period.
ENGINE_CHECK_INTERVAL_S = 1.0

#: Admission decisions on the default lane's requests, by what `GET /ready`
#: answered at that moment: how far readiness agrees with admission, measured
#: where admission decides (`Health.decided`).
READINESS_AT_ADMISSION: Final = "offload_vllm_readiness_at_admission"

_decision_family = once_per_process(
    lambda prometheus_client: prometheus_client.Counter(
        READINESS_AT_ADMISSION,
        "Admission decisions on default-lane pooling requests (decision: admitted, or refused for a full "
        "bound) by what GET /ready on the health port answered at that moment (ready: 200, 503).",
        ["decision", "ready"],
    )
)


def decision_counters() -> dict[tuple[bool, int], Any] | None:
    """`(admitted, readiness's status code)` -> its counter, each series looked
    up once so that counting is one `inc()` (every series shows on `/metrics`
    from here on, at 0 until counted); None when metrics are off."""
    if not offload.metrics_enabled():
        return None
    family = _decision_family()
    return {
        (admitted, code): family.labels("admitted" if admitted else "refused", str(code))
        for admitted in (True, False)
        for code in (200, 503)
    }


@final
class HealthState:
    """What the loop publishes and the answering process reads: each value set
    here is written to this process's board at once, by the loop's thread
    alone (`keep_current`; `draining` also by a signal handler). With several
    API server processes the boards of all of them lie side by side in one
    memory (`share`, `adopt`), and the answers read every board."""

    __slots__ = ("_board", "_boards", "_memory", "_values", "count", "fd", "index")

    def __init__(self, max_stall: float) -> None:
        #: The boards' file descriptor, which the answering process inherits.
        self.fd = _shared_memory(_health_answer.BOARD_SIZE)
        self._memory = mmap.mmap(self.fd, _health_answer.BOARD_SIZE)
        #: The API server processes whose boards the memory holds, and this one's index.
        self.count, self.index = 1, 0
        self._boards = _health_answer.boards(self._memory, 1)
        self._board = self._boards[0]
        # Until the loop first publishes, count from now: a loop that never
        # starts the task is reported once the bound has passed.
        self._values = Snapshot(time.monotonic(), 0.0, max_stall, False, None, False)
        self._board.write(self._values)

    @property
    def board(self) -> Board:
        """This process's board."""
        return self._board

    def share(self, count: int) -> None:
        """Move to a new memory of `count` boards, as the first (index 0) of
        `count` API server processes: the others' boards count from now, so
        one that never joins (`adopt`) is reported once the bound has passed.
        On the loop's thread."""
        fd = _shared_memory(count * _health_answer.BOARD_SIZE)
        memory = mmap.mmap(fd, count * _health_answer.BOARD_SIZE)
        boards = _health_answer.boards(memory, count)
        for board in boards[1:]:
            board.write(Snapshot(time.monotonic(), 0.0, self._values.max_stall, False, None, False))
        self._move(fd, memory, boards, 0)

    def adopt(self, fd: int, count: int, index: int) -> None:
        """Publish from now on into board `index` of the memory `fd` of
        `count` boards (handed over by the first API server process). On the
        loop's thread."""
        memory = mmap.mmap(fd, count * _health_answer.BOARD_SIZE)
        self._move(fd, memory, _health_answer.boards(memory, count), index)

    def _move(self, fd: int, memory: mmap.mmap, boards: list[Board], index: int) -> None:
        board = boards[index]
        board.write(self._values)
        board.set_draining(self._board.read().draining)
        old_fd, old_memory = self.fd, self._memory
        self.fd, self._memory, self._boards, self._board = fd, memory, boards, board
        self.count, self.index = len(boards), index
        old_memory.close()
        os.close(old_fd)

    def publish(self, **values: Any) -> None:
        """Set several values at once (names as the properties below), in one write."""
        for name, value in values.items():
            if name == "draining" or not hasattr(self._values, name):
                raise AttributeError(name)
            setattr(self._values, name, value)
        self._board.write(self._values)

    @property
    def published(self) -> Snapshot:
        """What was last published (`draining` aside: read it from the board)."""
        return self._values

    @property
    def draining(self) -> bool:
        """Set from SIGTERM on (safe in a signal handler: one byte of its own)."""
        return self._board.read().draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self._board.set_draining(value)

    def liveness(self, now: float) -> tuple[int, dict[str, Any]]:
        """`(status code, body)` of `GET /health` at `time.monotonic()` `now`
        (`_health_answer.server_liveness`, over what every API server process published)."""
        return _health_answer.server_liveness(self._boards, now)

    def readiness(self, now: float) -> tuple[int, dict[str, Any]]:
        """`(status code, body)` of `GET /ready` at `now` (`_health_answer.server_readiness`)."""
        return _health_answer.server_readiness(self._boards, now)


def _shared_memory(size: int) -> int:
    """A file descriptor of a file in memory of `size` bytes, for the boards
    (inheritable only where passed)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("offload-vllm-health", os.MFD_CLOEXEC)
    else:
        import tempfile

        with tempfile.TemporaryFile() as file:
            fd = os.dup(file.fileno())
    os.ftruncate(fd, size)
    return fd


def refuse_beside_api_servers(port: int, api_servers: int) -> None:
    """Raise `OffloadVLLMConfigError`, naming both flags, when `api_servers`
    API server processes (more than one) cannot share the health port: off
    Linux, where they cannot meet (`_shared_board`). Checked where the port
    is bound (`Health.bind`, in every API server process, however vLLM was
    started) and by the launcher before anything starts."""
    if api_servers > 1 and not _shared_board.SUPPORTED:
        option = BY_NAME["health_port"]
        raise OffloadVLLMConfigError(
            f"{option.flag} ({option.env}={port}) cannot be used with --api-server-count {api_servers} on "
            f"{sys.platform}: the API server processes share the port through Linux's abstract Unix sockets; "
            "serve with one API server process, or without the health port"
        )


#: A health process that ended within this of its start is started again only
#: this long after that start: one that cannot run (a broken interpreter)
#: costs a start a second, not a loop of them.
RESTART_MIN_INTERVAL_S = 1.0


@final
class HealthServer:
    """The health endpoints' process: a child of the API server, answering on
    a socket this process binds, from `state`'s board. Started again whenever
    it ends before `close` (killed, out of memory), by a thread that waits on
    it: the socket stays bound here meanwhile, so probes sent in between
    queue on it and are answered by the next process, not refused."""

    def __init__(self, host: str, port: int, state: HealthState, setting: str) -> None:
        """Binds `host:port` now, and starts the process. Raises `OSError` whose
        message names `setting` when the port cannot be had (taken, not allowed)."""
        self.state = state
        listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            # A restarted server must get its port back at once (the connections
            # of the last one's probes may linger in TIME_WAIT).
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))
            listener.listen(64)
        except OSError as exc:
            listener.close()
            raise OSError(exc.errno, f"{setting}={port}: cannot listen on {host}:{port} for the health endpoints: {exc.strerror or exc}") from exc
        self._listener = listener
        self.port = int(listener.getsockname()[1])
        #: How many times the process was started again after it ended.
        self.restarts = 0
        # The process reads the end of this pipe; when this process ends (or
        # `close`s) the pipe closes and so does the answering process.
        self._pipe_end, self._pipe = os.pipe()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._started_at = time.monotonic()
        self._process = self._start()
        self._keeper = threading.Thread(target=self._keep_running, name="offload-vllm-health-keeper", daemon=True)
        self._keeper.start()

    def _start(self) -> subprocess.Popen[bytes]:
        self._started_at = time.monotonic()
        return subprocess.Popen(
            [
                sys.executable, "-I", "-S", _health_answer.__file__,
                str(self._listener.fileno()), str(self.state.fd), str(self._pipe_end), str(os.getpid()),
                str(self.state.count),
            ],
            pass_fds=(self._listener.fileno(), self.state.fd, self._pipe_end),
            stdin=subprocess.DEVNULL,
            start_new_session=False,
        )

    def _keep_running(self) -> None:
        """Wait for the process; start it again if it ended before `close`.

        A start that fails (`OSError`: no interpreter, no memory, no process
        left) is tried again every `RESTART_MIN_INTERVAL_S`, logged as an
        error at the first failure alone; the warning of the start that works
        says how many failed. Probes sent meanwhile wait on the bound port."""
        failed = 0
        while True:
            code = self._process.wait()
            if self._closing.wait(max(0.0, self._started_at + RESTART_MIN_INTERVAL_S - time.monotonic())):
                return
            with self._lock:
                if self._closing.is_set():
                    return
                how = f"signal {-code}" if code < 0 else f"exit status {code}"
                try:
                    self._process = self._start()
                except OSError as exc:
                    if not failed:
                        logger.error(
                            "offload-vllm: the health endpoints' process ended (%s) and could not be started again: "
                            "%s; trying again every %gs", how, exc, RESTART_MIN_INTERVAL_S,
                        )
                    failed += 1
                    self._started_at = time.monotonic()
                    continue
                self.restarts += 1
            logger.warning(
                "offload-vllm: the health endpoints' process ended (%s); started it again (pid %d, restart %d%s)",
                how, self._process.pid, self.restarts, f", after {failed} failed start{'s' * (failed > 1)}" if failed else "",
            )
            failed = 0

    @property
    def pid(self) -> int:
        """The answering process's id (it changes when the process is started again)."""
        return self._process.pid

    def close(self) -> None:
        """End the process (its connections with it) and wait for it."""
        with self._lock:
            self._closing.set()
            with contextlib.suppress(OSError):
                os.close(self._pipe)
            self._process.kill()
            self._process.wait()
        self._keeper.join()
        with contextlib.suppress(OSError):
            os.close(self._pipe_end)
        self._listener.close()


def _mark_draining_on_sigterm(state: HealthState) -> None:
    """Make SIGTERM mark `state` draining, keeping what SIGTERM did before.

    vLLM handles SIGTERM through the event loop (`loop.add_signal_handler`,
    which takes the signal through asyncio's wake-up file descriptor: the
    Python-level handler it sets does nothing), so a Python-level handler set
    over it runs beside it, not instead. Called on the main thread; the
    handler is set again whenever something replaced it."""
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGTERM)
    if getattr(current, "__offload_vllm__", False):
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        state.draining = True
        if callable(current):
            current(signum, frame)

    on_sigterm.__offload_vllm__ = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGTERM, on_sigterm)


async def keep_current(
    state: HealthState,
    executor_of: Callable[[], offload.Executor | None],
    engine_client: Any,
    readiness: Readiness | None = None,
) -> None:
    """Publish the loop's turns, readiness's rule (`readiness`, default: the
    typical cost 1) and the engine's health into `state`, forever (a task on
    the API server's loop; cancel it to stop)."""
    readiness = Readiness() if readiness is None else readiness
    engine_due = 0.0
    while True:
        now = time.monotonic()
        executor = executor_of()
        state.publish(loop_turned_at=now, refusing=executor is not None and readiness.refuses(executor))
        _mark_draining_on_sigterm(state)
        if now >= engine_due:
            engine_due = now + ENGINE_CHECK_INTERVAL_S
            error: str | None = None
            try:
                with anyio.fail_after(state.published.max_stall):
                    await engine_seam.check_health(engine_client)
            except TimeoutError:
                error = f"its health check did not answer within {state.published.max_stall:g}s"
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            state.publish(engine_error=error, engine_checked_at=time.monotonic())
        await anyio.sleep(PUBLISH_INTERVAL_S)


@final
class Health(AdmissionListener):
    """The health endpoints of one API server process: the answering process,
    started when vLLM builds its app, and the loop's task, started when vLLM
    builds its app state with the engine client (inside the loop); a
    listener on admission (`changed`, `decided`).

    With several API server processes (`--api-server-count N`) the port is
    the server's: bound when the engine client says which process this is
    (`watch`), by the first, which reads every process's board; the others
    join it (`_shared_board`)."""

    def __init__(self, port: int, max_stall: float, setting: str, readiness: Readiness | None = None) -> None:
        """`readiness`: readiness's rule over admission (default: `Readiness()`'s)."""
        self.state = HealthState(max_stall)
        self.readiness = Readiness() if readiness is None else readiness
        self._port = port
        self._setting = setting
        self.server: HealthServer | None = None
        self._task: Any = None
        #: `decision_counters()`, looked up at the first decision (`None` until
        #: then, and after it with metrics off).
        self._decisions: dict[tuple[bool, int], Any] | None = None
        self._decisions_looked_up = False
        #: vLLM's `--host`, while the port waits for `watch` to say which of
        #: several API server processes this is (`bind`).
        self._host_pending: str | None = None
        self.boards_host: _shared_board.BoardHost | None = None
        self._joining: threading.Thread | None = None

    def bind(self, host: str | None, api_servers: int = 1) -> None:
        """Listen on `host` (`None` or empty: every interface), once, in a
        server of `api_servers` API server processes; with more than one,
        only once `watch` knows this process's index (refused where they
        cannot share the port: `refuse_beside_api_servers`)."""
        refuse_beside_api_servers(self._port, api_servers)
        if api_servers > 1:
            self._host_pending = host or "0.0.0.0"
        else:
            self._listen(host or "0.0.0.0")

    def _listen(self, host: str) -> None:
        if self.server is None:
            self.server = HealthServer(host, self._port, self.state, self._setting)
            servers = f", for the {self.state.count} API server processes" if self.state.count > 1 else ""
            logger.info("offload-vllm: health endpoints /health and /ready on %s:%d%s", host, self.server.port, servers)

    def _meet(self, index: int, count: int) -> None:
        """This is API server `index` of `count`: the first shares the boards,
        listens, and hands the boards to the others; the others join it (in a
        thread: the first may not listen yet), publishing into their own
        board meanwhile, which nothing reads."""
        host, self._host_pending = self._host_pending, None
        assert host is not None
        if count <= 1:  # an entry point that runs one API server whatever the flag says
            self._listen(host)
            return
        if index == 0:
            self.state.share(count)
            self._listen(host)
            self.boards_host = _shared_board.BoardHost(self.state.fd, count, self._port)
            return
        import asyncio

        loop = asyncio.get_running_loop()

        def join() -> None:
            try:
                fd = _shared_board.join(self._port, index)
            except RuntimeError as exc:
                logger.error("offload-vllm: API server %d of %d cannot join the health port: %s", index + 1, count, exc)
                return
            loop.call_soon_threadsafe(self.state.adopt, fd, count, index)
            logger.info("offload-vllm: API server %d of %d publishes to the health port", index + 1, count)

        self._joining = threading.Thread(target=join, name="offload-vllm-health-join", daemon=True)
        self._joining.start()

    def changed(self, executor: offload.Executor) -> None:
        """Publish whether admission refuses now (on the loop's thread, when its
        counts changed, and before each admission decision): readiness then
        follows admission within one probe, not within `PUBLISH_INTERVAL_S`,
        in which a bound full under load may fill and free many times (one
        request answered every ~7 ms at 128 clients here). Before each
        decision, because counts also change unseen by admission (a request's
        render call queued on a worker takes a place of `max_queue`, a call
        started leaves the queued cost): published only on admission's own
        changes, a refusal could find 200 still published
        (docs/operations.md, "Readiness beside admission")."""
        self.state.publish(refusing=self.readiness.refuses(executor))

    def decided(self, request: Priced, admitted: bool) -> None:
        """Count, for a `request` of the default lane just admitted or
        refused for a full bound, what `GET
        /ready` answers now (`READINESS_AT_ADMISSION`), on the loop's thread,
        before the decision is published (`changed`). It is read
        from the board, as the answering process reads it (liveness and
        draining included): what was published, not readiness's rule applied
        afresh, which would agree with the decision by construction."""
        if request.lane != DEFAULT_LANE:
            return
        if not self._decisions_looked_up:
            self._decisions_looked_up = True
            self._decisions = decision_counters()
        if self._decisions is None:
            return
        code, _ = self.state.readiness(time.monotonic())
        self._decisions[admitted, code].inc()

    def watch(self, executor_of: Callable[[], offload.Executor | None], engine_client: Any) -> None:
        """Start the loop's task (once; on the running loop); with several API
        server processes, bind the port or join the process that does
        (`_meet`), as vLLM's config in `engine_client` says which this is."""
        import asyncio

        with contextlib.suppress(RuntimeError):  # no running loop: offline use
            loop = asyncio.get_running_loop()
            if self._host_pending is not None:
                self._meet(*config_seam.api_server_of(engine_client.vllm_config))
            if self._task is None or self._task.done():
                self._task = loop.create_task(
                    keep_current(self.state, executor_of, engine_client, self.readiness), name="offload-vllm-health"
                )
