"""`process`: long-lived worker processes that survive crashes."""

from __future__ import annotations

import atexit
import itertools
import multiprocessing
import os
import pickle
import signal
import threading
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from typing import Any, final

from .._call import Call
from .._config import check_initializer, check_max_workers, usable_cpu_count
from .._errors import ConfigError, OffloadError, WorkerCrashed
from .._executor import Executor
from .._metrics import count_worker_restart
from .._startup import Startup
from . import _process_worker, _wire
from ._dispatch import Dispatcher
from ._fork import forget_in_child

_pool_ids = itertools.count()

#: `forkserver` where the platform has it: a worker is forked from a small,
#: single-threaded server process (never from the parent, whose threads and
#: torch/OpenMP state make `fork` unsafe), and starts a worker faster than
#: `spawn`, which re-imports everything in every new worker.
DEFAULT_START_METHOD = (
    "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
)
_START_METHODS = ("forkserver", "spawn")
_CANCEL_MODES = ("finish", "kill")

#: How long a worker that was asked to stop may take before it is killed.
_STOP_GRACE = 5.0

_live: weakref.WeakSet[ProcessExecutor] = weakref.WeakSet()


@atexit.register
def _shutdown_all() -> None:
    # Registered after multiprocessing's own exit hook, so it runs first: the
    # workers are gone before multiprocessing joins them. Running calls are
    # cut short, as a `thread` call is (its daemon thread just stops): one
    # stuck call must not hold up interpreter exit.
    for executor in list(_live):
        executor._terminate()


def _forget_parents_forkserver() -> None:
    """In a child made by `os.fork()`: multiprocessing's forkserver is the
    parent's child, not ours (checking on it with `waitpid` fails here), so
    forget it; the first worker started here starts a fresh one. The standard
    library resets this state only in children it starts itself."""
    from multiprocessing import forkserver

    server: Any = forkserver._forkserver
    if server._forkserver_pid is None:
        return
    alive_fd = server._forkserver_alive_fd
    server.__init__()
    if alive_fd is not None:
        # Our copy would keep the parent's server alive after the parent.
        os.close(alive_fd)


def _exit_reason(exitcode: int | None) -> str:
    if exitcode is None:
        return "exited (status unknown)"
    if exitcode < 0:
        try:
            return f"was killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def _picklable(value: object) -> bool:
    try:
        pickle.dumps(value, protocol=5)
    except Exception:
        return False
    return True


def _pickling_error(call: Call[Any], exc: BaseException) -> TypeError:
    """Find what could not be pickled and say so."""
    parts = (
        (f"function {call.fn!r}", call.fn),
        *((f"argument {i} ({type(a).__name__})", a) for i, a in enumerate(call.args)),
        *((f"keyword argument {k!r} ({type(v).__name__})", v) for k, v in call.kwargs.items()),
    )
    culprit = next((label for label, value in parts if not _picklable(value)), "the call")
    error = TypeError(
        f"process strategy: {culprit} cannot be pickled, so it cannot be sent to a worker "
        f"process ({type(exc).__name__}: {exc}); pass module-level functions and picklable values"
    )
    error.__cause__ = exc
    return error


def _start_failure(error: BaseException, when: str) -> OffloadError:
    """What a caller gets when its worker process could not start."""
    if isinstance(error, WorkerCrashed):
        # It died while starting (killed, out of memory): a crash, as if it had
        # died under a call.
        failure: OffloadError = WorkerCrashed(f"{error} while starting, {when}")
    else:
        failure = OffloadError(f"process strategy: could not start a worker: {error!r}")
    failure.__cause__ = error
    return failure


def _rebuild_error(payload: tuple[BaseException | None, str]) -> BaseException:
    exception, text = payload
    if exception is not None:
        if exception.__traceback__ is None and text and hasattr(exception, "add_note"):
            # It came without its frames (too deep to pickle): keep them as text.
            exception.add_note(f"traceback in the worker process:\n{text}")
        return exception
    return OffloadError(
        "the offloaded function raised an exception that cannot be pickled; "
        f"its traceback in the worker:\n{text}"
    )


@final
class _Worker:
    """One slot of the pool: a thread in this process that owns one worker
    process at a time, sends it calls one by one and replaces it when it dies
    or is retired."""

    def __init__(self, pool: ProcessExecutor, number: int, startup: Startup | None = None) -> None:
        self.pool = pool
        self.startup = startup
        self.process: multiprocessing.process.BaseProcess | None = None
        self.conn: Connection | None = None
        self.current: Call[Any] | None = None
        self.killed = False  # set under the dispatcher's lock by `cancel="kill"`
        self.tasks = 0
        self.tx = _wire.Sender()
        self.rx = _wire.Receiver()
        self.thread = threading.Thread(
            target=self.work, name=f"{pool._name}-{number}", daemon=True
        )

    # ---- process lifecycle ------------------------------------------------

    def start_process(self) -> BaseException | None:
        """Start a worker process and wait for its initializer; return the error
        that prevented it, if any."""
        pool = self.pool
        ctx = pool._context
        try:
            parent_end, child_end = ctx.Pipe()
        except BaseException as exc:  # EMFILE: this call fails, the next one retries
            return exc
        process = ctx.Process(  # type: ignore[attr-defined]
            target=_process_worker.main,
            args=(child_end, pool._alive_r, pool._initializer, pool._initargs,
                  pool._threshold, pool._max_worker_memory),
            name=f"{pool._name}-worker",
        )
        try:
            process.start()
        except BaseException as exc:
            parent_end.close()
            child_end.close()
            return exc
        child_end.close()
        # Every `Process.start()` polls all the children multiprocessing knows
        # of. Under forkserver a poll *reads* the exit status from the
        # sentinel, so another slot's start racing this slot's `join` takes
        # the status and leaves this slot EOF, reported as exit code 255.
        # This slot alone reaps its process.
        multiprocessing.process._children.discard(process)  # type: ignore[attr-defined]
        self.process, self.conn, self.tasks, self.killed = process, parent_end, 0, False
        try:
            reply = self.receive()
        except WorkerCrashed as exc:
            return exc
        except _wire.StreamBroken as exc:
            self.abandon()
            return exc
        if reply[0] == "init-error":
            self.reap()
            return _rebuild_error(reply[1])
        if reply[0] != "ready":
            self.abandon()
            return _rebuild_error(reply[1])
        return None

    def receive(self) -> Any:
        """The next message from the worker; `WorkerCrashed` if it dies first,
        `_wire.StreamBroken` if its frame could not be read whole (the pipe
        is then out of step: the caller must `abandon` this process)."""
        assert self.conn is not None
        assert self.process is not None
        ready = wait([self.conn, self.process.sentinel])
        if self.conn in ready:
            try:
                message = self.rx.read(self.conn)
            except (EOFError, OSError):
                raise self.crashed() from None
            try:
                return self.rx.decode(message)
            except Exception as exc:
                # The frame arrived whole (the pipe is in step) but the reply
                # cannot be rebuilt here: its class cannot be imported in this
                # process, no memory to copy it, no file descriptor to map it.
                # Only this call fails.
                error = OffloadError(f"the worker's reply could not be unpickled here: {exc!r}")
                error.__cause__ = exc
                return ("error", (error, ""), False)
        raise self.crashed()

    def abandon(self) -> None:
        """Kill the current process at once (its pipe cannot be trusted) and reap it."""
        if self.process is not None:
            try:
                self.process.kill()
            except (ValueError, OSError):
                pass  # already dead
        self.reap()

    def crashed(self) -> WorkerCrashed:
        """Reap the dead process and describe its death."""
        pid = None if self.process is None else self.process.pid
        self.reap()
        return WorkerCrashed(f"worker process {pid} {_exit_reason(self.exitcode)}")

    exitcode: int | None = None

    def reap(self) -> None:
        """Forget the current process after it ended (or make it end)."""
        process, conn = self.process, self.conn
        self.process = self.conn = None
        if process is None:
            return
        process.join(_STOP_GRACE)
        if process.exitcode is None:
            process.kill()
            process.join()
        self.exitcode, pid = process.exitcode, process.pid
        if conn is not None:
            conn.close()
        process.close()
        self.tx.close()
        self.rx.close()
        if pid is not None:
            _wire.remove_shm_files(_wire.shm_prefix(pid))

    def stop_process(self) -> None:
        if self.conn is not None:
            try:
                self.conn.send_bytes(b"")
            except OSError:
                pass
        self.reap()

    def alive(self) -> bool:
        return self.process is not None and not self.killed and not wait(
            [self.process.sentinel], timeout=0
        )

    # ---- the slot's loop --------------------------------------------------

    def work(self) -> None:
        calls = self.pool._dispatch.calls()
        try:
            startup, self.startup = self.startup, None
            if startup is not None:
                # Started by `ProcessExecutor.start()`: the process now, not at the first call.
                try:
                    error = self.start_process()
                except BaseException as exc:
                    startup.finished(_start_failure(exc, "during start()"))
                    raise
                startup.finished(None if error is None else _start_failure(error, "during start()"))
            for call in calls:
                try:
                    self.run(call)
                except BaseException as exc:  # noqa: PERF203 (per call, by design)
                    # A bug here must not leave the caller waiting forever.
                    if not call.done:
                        call.set_exception(OffloadError(f"process strategy failed: {exc!r}"))
                    raise
        finally:
            calls.close()
            self.stop_process()
            self.pool._dispatch.discard(self)

    def run(self, call: Call[Any]) -> None:
        try:
            self._run(call)
        finally:
            with self.pool._dispatch.lock:
                self.pool._doomed.discard(call)

    def _run(self, call: Call[Any]) -> None:
        pool = self.pool
        if not self.alive():
            if self.process is not None:
                self.reap()  # died (or was killed) while idle: not this call's fault
                count_worker_restart(pool, "crashed")
            error = self.start_process()
            if error is not None:
                call.set_exception(_start_failure(error, "before this call ran"))
                return
        try:
            data, buffers = _wire.dumps(
                (
                    _wire.by_reference(call.fn),
                    tuple(_wire.wrap_bytes(a, pool._threshold) for a in call.args),
                    {k: _wire.wrap_bytes(v, pool._threshold) for k, v in call.kwargs.items()},
                ),
                pool._threshold,
            )
        except Exception as exc:
            call.set_exception(_pickling_error(call, exc))
            return
        assert self.conn is not None
        with pool._dispatch.lock:
            # `cancel="kill"` found no worker running this call: its owner was
            # cancelled after the claim, before this point. It must not start.
            doomed = call in pool._doomed
            self.current = None if doomed else call
        if doomed:
            call.set_exception(OffloadError("the call was cancelled before it started"))
            return
        try:
            self.tx.send(self.conn, data, buffers)
            del data, buffers
            reply = self.receive()
        except _wire.ArenaError as exc:
            # This process could not make the shared memory (out of file
            # descriptors, say): nothing was sent, the worker is fine.
            with pool._dispatch.lock:
                self.current = None
            error = OffloadError(f"process strategy: the call's arguments could not be sent: {exc}")
            error.__cause__ = exc.__cause__
            call.set_exception(error)
            return
        except _wire.StreamBroken as exc:
            with pool._dispatch.lock:
                self.current = None
            error = OffloadError(
                f"process strategy: the worker's reply was lost ({exc}); the worker was replaced"
            )
            error.__cause__ = exc.__cause__
            call.set_exception(error)
            self.abandon()
            self.replace("crashed")
            return
        except (WorkerCrashed, OSError) as exc:
            with pool._dispatch.lock:
                self.current = None
            crash = exc if isinstance(exc, WorkerCrashed) else self.crashed()
            name = getattr(call.fn, "__qualname__", None) or repr(call.fn)
            call.set_exception(WorkerCrashed(f"{crash} while running {name}()"))
            self.replace("crashed")
            return
        with pool._dispatch.lock:
            self.current = None
        status, value, retire = reply
        del reply
        self.tasks += 1
        if status == "ok":
            call.set_result(value)
        else:
            call.set_exception(_rebuild_error(value))
        del value
        if retire or (pool._max_tasks is not None and self.tasks >= pool._max_tasks):
            self.stop_process()
            self.replace("retired")

    def replace(self, reason: str) -> None:
        """Start a fresh process now, so the pool is back to full strength before
        the next call needs it (a failure here is retried by that call)."""
        if self.pool._dispatch.stopping:
            return
        count_worker_restart(self.pool, reason)
        if self.start_process() is not None:
            self.reap()


@final
class ProcessExecutor(Executor):
    """Runs calls in up to `max_workers` long-lived worker processes.

    Use it for pure-Python work that holds the GIL (chat templates, image
    processors, building large JSON): the event loop's process never runs it,
    so the loop stays responsive.

    **What crosses the boundary.** The function (by reference: module-level
    functions and classes) and its arguments are pickled to the worker, the
    result or exception pickled back. Something that cannot be pickled fails
    the call with `TypeError` naming it. `contextvars` do not cross: the
    function runs in the worker's own context. An exception reaches the caller
    with the same type and message and the function's own frames in its
    traceback (rebuilt with tblib).

    **Large payloads.** Buffers of `shared_memory_threshold` bytes or more
    (NumPy arrays, `bytearray`, CPU torch tensors, and `bytes` passed or
    returned directly) travel through shared memory instead of the pipe, both
    ways; received arrays are views of it (no copy).

    **Crashes.** If a worker dies while running a call (a signal, a segfault,
    `os._exit`), that call raises `WorkerCrashed` naming the exit code or
    signal; other calls are unaffected, and a fresh process takes its place.

    **Cancellation.** As for every strategy, a call that has not started never
    starts, and by default (`cancel="finish"`) a running call finishes in its
    worker with its result dropped. With `cancel="kill"`, the worker running a
    cancelled call is killed at once and replaced: use it for long calls whose
    results are worthless once nobody waits, and whose side effects may be
    cut short.

    **Lifetime.** Workers start on the first calls (not at construction) and
    stay. `shutdown()` stops them; they also exit on their own if this
    process dies. At interpreter exit, queued calls are dropped and running
    ones are cut short (their workers killed), so a stuck call cannot hold up
    exit. In a child made by `os.fork()` the pool starts empty: the child's
    calls run in fresh workers of its own.

    **Failures of this process.** If shared memory cannot be set up for a
    call's arguments here (no file descriptor left, say), that call fails
    with `OffloadError` naming the cause and the worker is left alone; if
    `/dev/shm` is full, the buffers go through the pipe instead. A reply that
    cannot be rebuilt here fails only its own call.

    Args:
        max_workers: at most this many worker processes (and concurrent calls).
            `None`: `OFFLOAD_MAX_WORKERS`, else the number of usable CPUs (more
            processes than cores only add switching).
        initializer: run once in each worker process, before its first call;
            its return value is that process's `worker_state()`. Must be
            picklable. If it raises, the call that started the worker fails
            with `OffloadError` (the cause attached).
        initargs: positional arguments for `initializer` (picklable).
        max_tasks_per_worker: replace a worker after this many calls. `None`
            (default): never; set it to contain a slow leak.
        max_worker_memory: replace a worker after a call that left its resident
            memory (RSS) above this many bytes. `None` (default): no ceiling.
        shared_memory_threshold: buffers of at least this many bytes go through
            shared memory. Default 256 KiB (measured: below it the pipe is
            as fast); `None` turns shared memory off.
        cancel: `"finish"` (default, the rule of every strategy) or `"kill"`.
        start_method: `"forkserver"` (default where available) or `"spawn"`;
            `"fork"` is refused (unsafe once the parent runs threads or torch).
        max_queue: calls that may wait for a busy pool before new ones fail
            with `Overloaded` (nothing pickled or sent). `None` (default): unbounded.
    """

    name = "process"
    carries_context = False

    def __init__(
        self,
        max_workers: int | None = None,
        *,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
        max_tasks_per_worker: int | None = None,
        max_worker_memory: int | None = None,
        shared_memory_threshold: int | None = _wire.DEFAULT_SHM_THRESHOLD,
        cancel: str = "finish",
        start_method: str | None = None,
        max_queue: int | None = None,
    ) -> None:
        self._max_workers = (
            usable_cpu_count() if max_workers is None else check_max_workers(max_workers)
        )
        check_initializer(initializer, initargs)
        if max_tasks_per_worker is not None:
            check_max_workers(max_tasks_per_worker, source="max_tasks_per_worker")
        if max_worker_memory is not None:
            check_max_workers(max_worker_memory, source="max_worker_memory")
        if shared_memory_threshold is not None:
            check_max_workers(shared_memory_threshold, source="shared_memory_threshold")
        if cancel not in _CANCEL_MODES:
            raise ConfigError(f"cancel must be one of {_CANCEL_MODES}, got {cancel!r}")
        start_method = DEFAULT_START_METHOD if start_method is None else start_method
        if start_method not in _START_METHODS:
            raise ConfigError(
                f"start_method must be one of {_START_METHODS} (fork is unsafe with threads), "
                f"got {start_method!r}"
            )
        self._initializer = initializer
        self._initargs = initargs
        self._max_tasks = max_tasks_per_worker
        self._max_worker_memory = max_worker_memory
        self._threshold = shared_memory_threshold
        self._kill_on_cancel = cancel == "kill"
        self._start_method = start_method
        self._name = f"offload-process-{next(_pool_ids)}"
        self._spawned = itertools.count()
        self._dispatch: Dispatcher[_Worker] = self._new_dispatcher()
        self._prepare_lock = threading.Lock()
        # Made on first use: nothing (no pipe, no server process) exists until a call.
        self._ctx: BaseContext | None = None
        self._alive_r: Connection | None = None
        self._alive_w: Connection | None = None
        # Running calls whose owner was cancelled (`cancel="kill"`) before their
        # slot marked them current; guarded by the dispatcher's lock.
        self._doomed: set[Call[Any]] = set()
        forget_in_child(self)
        self._set_max_queue(max_queue)

    def _new_dispatcher(self) -> Dispatcher[_Worker]:
        return Dispatcher("ProcessExecutor", self._max_workers, self._start_worker)

    def _after_fork_in_child(self) -> None:
        super()._after_fork_in_child()
        # The worker processes are the parent's: close this child's copies of
        # their pipes (the parent's death must still reach them as end of
        # file), and keep multiprocessing from joining them at this child's exit.
        for worker in self._dispatch._workers:
            if worker.conn is not None:
                worker.conn.close()
            if worker.process is not None:
                multiprocessing.process._children.discard(worker.process)  # type: ignore[attr-defined]
        for conn in (self._alive_r, self._alive_w):
            if conn is not None:
                conn.close()
        if self._ctx is not None and self._start_method == "forkserver":
            _forget_parents_forkserver()
        stopping = self._dispatch.stopping
        self._dispatch = self._new_dispatcher()
        if stopping:
            self._dispatch.close(cancel_futures=True)
        self._prepare_lock = threading.Lock()
        self._ctx = self._alive_r = self._alive_w = None
        self._doomed = set()
        _live.discard(self)

    @property
    def max_workers(self) -> int:
        return self._max_workers

    @property
    def _context(self) -> BaseContext:
        assert self._ctx is not None
        return self._ctx

    def _prepare(self) -> None:
        ctx = multiprocessing.get_context(self._start_method)
        if self._start_method == "forkserver":
            # Workers fork with the worker module already imported.
            ctx.set_forkserver_preload(["offload._strategies._process_worker"])
        # Workers read the one end; this process alone holds the other, so its
        # death is an end of file in every worker.
        self._alive_r, self._alive_w = ctx.Pipe(duplex=False)
        self._ctx = ctx
        _live.add(self)

    def _worker_pids(self) -> list[int]:
        """Pids of the live worker processes (for tests and diagnostics)."""
        processes = [w.process for w in self._dispatch.workers()]
        return [p.pid for p in processes if p is not None and p.pid is not None]

    def _capacity(self) -> int:
        return self._max_workers

    def _terminate_running(self) -> bool:
        for worker in self._dispatch.workers():
            with self._dispatch.lock:
                process = worker.process
                if worker.current is not None and process is not None:
                    worker.killed = True
                    try:
                        process.kill()
                    except (ValueError, OSError):
                        pass  # it is already dead and being reaped
        return True

    def _start_worker(self, startup: Startup | None = None) -> _Worker:
        worker = _Worker(self, next(self._spawned), startup)
        worker.thread.start()
        return worker

    def start(self) -> None:
        super().start()
        self._ensure_prepared()
        startup = Startup()
        startup.expect(self._dispatch.fill(lambda: self._start_worker(startup)))
        startup.wait()

    def _ensure_prepared(self) -> None:
        if self._ctx is None:
            with self._prepare_lock:
                if self._ctx is None and not self._dispatch.stopping:
                    self._prepare()

    def _schedule(self, call: Call[Any]) -> None:
        self._ensure_prepared()
        self._dispatch.put(call)

    def _cancel_running(self, call: Call[Any]) -> None:
        if not self._kill_on_cancel:
            return
        with self._dispatch.lock:  # `current` changes under this lock
            for worker in self._dispatch._workers:
                process = worker.process
                if worker.current is call and process is not None:
                    worker.killed = True
                    try:
                        process.kill()
                    except (ValueError, OSError):
                        pass  # it is already dead and being reaped
                    return
            if not call.done:
                # Claimed, not yet sent: its slot checks this before sending.
                self._doomed.add(call)

    def _terminate(self) -> None:
        """Interpreter exit: drop queued calls, kill the workers running a call,
        stop the idle ones; return within a bounded time."""
        self._closed = True
        workers = self._dispatch.close(cancel_futures=True)

        def kill_busy() -> None:
            with self._dispatch.lock:
                for worker in workers:
                    if worker.current is not None and worker.process is not None:
                        worker.killed = True
                        try:
                            worker.process.kill()
                        except (ValueError, OSError):
                            pass

        kill_busy()
        for worker in workers:
            # Bounded: a call claimed just now is killed on the second pass.
            worker.thread.join(_STOP_GRACE)
            if worker.thread.is_alive():
                kill_busy()
                worker.thread.join(_STOP_GRACE)
        self._shutdown(wait=False, cancel_futures=True)

    def _shutdown(self, wait: bool, cancel_futures: bool) -> None:
        self._dispatch.close(cancel_futures)
        if wait:
            me = threading.current_thread()
            # Until none is left: a slot that exits while calls are queued
            # hands them to a fresh one (`Dispatcher.discard`).
            while others := [w for w in self._dispatch.workers() if w.thread is not me]:
                for worker in others:
                    worker.thread.join()
            with self._prepare_lock:
                if not self._dispatch.workers() and self._alive_w is not None:
                    self._alive_w.close()
                    self._alive_w = None
                    if self._alive_r is not None:
                        self._alive_r.close()
                        self._alive_r = None
                _live.discard(self)
