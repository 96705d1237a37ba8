"""The health endpoints' process and what it answers (`offload_vllm._health`,
`_health_answer`), without a vLLM server: the state the loop publishes, read
by the real answering process. End to end, on a real server: `test_operations.py`."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import anyio
import httpx
import psutil
import pytest
from offload_vllm import _health_answer as health_answer
from offload_vllm._admission import EngineRequests, Priced, Readiness, RefuseWhenFull, RequestPolicy
from offload_vllm._health import (
    ENGINE_CHECK_INTERVAL_S,
    PUBLISH_INTERVAL_S,
    READINESS_AT_ADMISSION,
    RESTART_MIN_INTERVAL_S,
    Health,
    HealthServer,
    HealthState,
    _mark_draining_on_sigterm,
    keep_current,
)
from offload_vllm._lanes import LaneRouter
from offload_vllm._retry_after import DrainRates
from offload_vllm._seams.errors import ANSWERS

import offload

from ._server import free_port


@pytest.fixture
def health_server() -> Iterator[HealthServer]:
    state = HealthState(max_stall=3600.0)
    server = HealthServer("127.0.0.1", 0, state, "OFFLOAD_VLLM_HEALTH_PORT")
    try:
        # Once the process answers (it starts in ~0.1 s, longer on a loaded
        # machine), the bound the tests read.
        assert httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=60).status_code == 200
        state.publish(max_stall=1.0, loop_turned_at=time.monotonic())
        yield server
    finally:
        server.close()


@pytest.fixture
def served(health_server: HealthServer) -> tuple[HealthState, str]:
    return health_server.state, f"http://127.0.0.1:{health_server.port}"


def test_liveness_and_readiness_read_what_the_loop_published(served: tuple[HealthState, str]) -> None:
    state, url = served
    state.publish(loop_turned_at=time.monotonic())
    state.publish(engine_checked_at=time.monotonic())
    live, ready = httpx.get(f"{url}/health"), httpx.get(f"{url}/ready")
    assert (live.status_code, live.json()["status"]) == (200, "ok")
    assert (ready.status_code, ready.json()["status"]) == (200, "ready")
    assert live.headers["content-type"] == "application/json"

    state.publish(refusing=True)
    ready = httpx.get(f"{url}/ready")
    assert ready.status_code == 503
    assert "admission refuses" in ready.json()["reason"]
    assert httpx.get(f"{url}/health").status_code == 200  # busy is alive
    state.publish(refusing=False)

    state.draining = True
    assert httpx.get(f"{url}/ready").json()["reason"] == "shutting down"
    state.draining = False

    state.publish(engine_error="EngineDeadError")
    live = httpx.get(f"{url}/health")
    assert live.status_code == 503
    assert live.json()["reason"] == "the engine is not alive: EngineDeadError"
    assert httpx.get(f"{url}/ready").status_code == 503
    state.publish(engine_error=None)

    state.publish(loop_turned_at=time.monotonic() - 3)
    live = httpx.get(f"{url}/health")
    assert live.status_code == 503
    assert live.json()["reason"].startswith("the event loop has not turned for 3.")
    assert live.json()["reason"].endswith("s (bound 1s)")
    assert httpx.get(f"{url}/ready").status_code == 503

    missing = httpx.get(f"{url}/metrics")
    assert missing.status_code == 404
    assert missing.json()["paths"] == ["/health", "/ready"]


def test_a_taken_port_is_refused_naming_the_setting() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"OFFLOAD_VLLM_HEALTH_PORT={port}: cannot listen on 127.0.0.1:{port}"):
            HealthServer("127.0.0.1", port, HealthState(1.0), "OFFLOAD_VLLM_HEALTH_PORT")


def _spin(stop: threading.Event) -> None:
    # Pure Python: holds the GIL but for the interpreter's switch interval.
    n = 0
    while not stop.is_set():
        n += 1


#: Probes `/health` at `argv[1]` `argv[2]` times, 20 ms apart, from its own
#: process (as a kubelet probes from outside): prints one line per probe, the
#: `time.monotonic()` it was sent at and the seconds until its answer; fails
#: on any answer but 200.
PROBE = """
import sys, time, http.client
from urllib.parse import urlsplit
where = urlsplit(sys.argv[1])
for _ in range(int(sys.argv[2])):
    sent = time.monotonic()
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
    connection.request("GET", "/health")
    status = connection.getresponse().status
    connection.close()
    print(sent, time.monotonic() - sent, flush=True)
    assert status == 200, status
    time.sleep(0.02)
"""


def _probes(url: str, count: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", PROBE, url, str(count)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _answered(probe: subprocess.Popen[str]) -> list[tuple[float, float]]:
    out, err = probe.communicate(timeout=120)
    assert probe.returncode == 0, err
    return [(float(sent), float(took)) for sent, took in (line.split() for line in out.splitlines())]


def test_probes_are_answered_while_threads_flood_the_gil(served: tuple[HealthState, str]) -> None:
    """Two threads of the server's process spinning in Python bytecode (a
    GIL-bound flood, one per core here) while a probe from another process
    asks 100 times: every probe is answered, each within 1 s (a wide margin:
    on this shared 2-core machine the slowest of 200 took 4 ms; a thread of
    the server's answering took 44 ms, and up to 0.4 s when the machine was
    loaded, each GIL hand-off waiting for the spinners' switch interval)."""
    state, url = served
    state.publish(max_stall=3600.0)  # the loop's side is not under test here
    stop = threading.Event()
    spinners = [threading.Thread(target=_spin, args=(stop,)) for _ in range(2)]
    for spinner in spinners:
        spinner.start()
    try:
        answered = _answered(_probes(url, 100))
    finally:
        stop.set()
        for spinner in spinners:
            spinner.join()
    assert len(answered) == 100
    assert max(took for _, took in answered) < 1.0, answered


def test_probes_are_answered_while_the_servers_gil_is_held(served: tuple[HealthState, str]) -> None:
    """One call that holds the server process's GIL for seconds without a
    switch (a C loop: `sum` over a range), as a long call of a C extension
    does: probes sent meanwhile are answered within 1 s all the same, because
    answering needs nothing of that interpreter (a thread of it answered
    none until the call returned)."""
    state, url = served
    state.publish(max_stall=3600.0)
    began = time.perf_counter()
    sum(range(10**7))
    per_item = (time.perf_counter() - began) / 10**7
    probe = _probes(url, 250)
    # Once the probe has answers, hold the GIL for about 4 s: at least the
    # 1.5 s asked below even if the machine, busy when the pace was timed,
    # runs the loop over twice as fast by then.
    assert probe.stdout is not None
    probe.stdout.readline()
    held_from = time.monotonic()
    sum(range(int(4.0 / per_item)))
    held_until = time.monotonic()
    answered = _answered(probe)
    during = [(sent, took) for sent, took in answered if held_from <= sent <= held_until - 1.0]
    assert held_until - held_from > 1.5  # the hold was long enough to tell
    assert during, (held_from, held_until, answered)
    assert max(took for _, took in during) < 1.0, during


def _raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(4096):
            answer += chunk
    return answer


def test_other_methods_bad_requests_and_a_silent_client(served: tuple[HealthState, str]) -> None:
    """POST is 405, a request line that is not HTTP is 400, HEAD has no body;
    a client that connects and sends nothing holds up no other probe."""
    _, url = served
    port = int(url.rsplit(":", 1)[1])
    assert _raw(port, b"POST /health HTTP/1.1\r\nContent-Length: 0\r\n\r\n").startswith(b"HTTP/1.1 405 ")
    assert _raw(port, b"hello\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    head = _raw(port, b"HEAD /health HTTP/1.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert head.endswith(b"\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port)) as silent:
        began = time.monotonic()
        assert httpx.get(f"{url}/ready", timeout=10).status_code == 200
        assert time.monotonic() - began < health_answer.REQUEST_TIMEOUT_S
        # Then it is dropped: its read ends (EOF) once the timeout has passed.
        silent.settimeout(10)
        assert silent.recv(100) == b""


#: Starts a health server, prints its process's pid, and ends without closing it.
ORPHAN = """
import os, sys
from offload_vllm._health import HealthServer, HealthState
server = HealthServer("127.0.0.1", 0, HealthState(1.0), "OFFLOAD_VLLM_HEALTH_PORT")
print(server.pid, flush=True)
os._exit(0)
"""


def test_the_answering_process_ends_with_the_server() -> None:
    done = subprocess.run([sys.executable, "-c", ORPHAN], capture_output=True, text=True, timeout=60, check=True)
    pid = int(done.stdout)
    deadline = time.monotonic() + 10
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the health process outlived its server"
        time.sleep(0.05)


def test_a_killed_answering_process_is_started_again(health_server: HealthServer) -> None:
    """SIGKILL the answering process: the port answers again within a few
    seconds (the process is started again; a probe sent meanwhile waits on the
    socket, which stays bound, and is answered too), and again after a second kill."""
    server, url = health_server, f"http://127.0.0.1:{health_server.port}"
    # No loop publishes here: the bound must outlast the restarts.
    server.state.publish(max_stall=3600.0, loop_turned_at=time.monotonic())
    for _ in range(2):
        killed = server.pid
        os.kill(killed, signal.SIGKILL)
        began = time.monotonic()
        assert httpx.get(f"{url}/health", timeout=30).status_code == 200
        assert time.monotonic() - began < 10
        assert server.pid != killed
    assert server.restarts == 2


class _Records(logging.Handler):
    """The adapter's log records (vLLM's logger, a parent of the adapter's, may not propagate to pytest's)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_process_that_cannot_be_started_again_is_tried_every_second(
    health_server: HealthServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answering process killed while no interpreter can be started (the
    path `sys.executable` names is gone, so the OS refuses to run it): the
    start is tried again every second, logged once as an error; probes sent
    meanwhile wait on the bound port, and are answered once a start works
    again, whose warning counts the failed ones."""
    server, url = health_server, f"http://127.0.0.1:{health_server.port}"
    server.state.publish(max_stall=3600.0, loop_turned_at=time.monotonic())
    records = _Records()
    adapter_logger = logging.getLogger("vllm.offload_vllm")
    adapter_logger.addHandler(records)
    try:
        monkeypatch.setattr(sys, "executable", "/nonexistent/python3")
        killed = server.pid
        os.kill(killed, signal.SIGKILL)
        # Three start periods: at least two failed starts.
        time.sleep(3 * RESTART_MIN_INTERVAL_S + 0.5)
        errors = [r.getMessage() for r in records.records if r.levelno == logging.ERROR]
        assert len(errors) == 1, errors
        assert "could not be started again" in errors[0]
        assert "signal 9" in errors[0]
        assert "No such file or directory" in errors[0]
        assert (server.pid, server.restarts) == (killed, 0)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(httpx.get, f"{url}/health", timeout=30)
            time.sleep(0.5)
            assert not waiting.done()  # queued on the bound port, not refused
            monkeypatch.undo()
            assert waiting.result().status_code == 200
        assert server.restarts == 1
        assert server.pid != killed
        warnings = [r.getMessage() for r in records.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, warnings
        assert re.search(r"started it again \(pid \d+, restart 1, after [2-9]\d* failed starts\)", warnings[0]), warnings
    finally:
        adapter_logger.removeHandler(records)


def test_health_takes_readiness_whole() -> None:
    """`Health` applies the `Readiness` it is given (the one rule, with its
    own default typical cost), not one it builds from a typical cost."""
    readiness = Readiness(lambda: 300.0)
    assert Health(0, 5.0, "OFFLOAD_VLLM_HEALTH_PORT", readiness).readiness is readiness
    assert isinstance(Health(0, 5.0, "OFFLOAD_VLLM_HEALTH_PORT").readiness, Readiness)


class _Engine:
    def __init__(self) -> None:
        self.dead = False

    async def check_health(self) -> None:
        if self.dead:
            raise RuntimeError("engine core died")


#: Longer than one turn of the loop's publishing task.
_TURN = PUBLISH_INTERVAL_S + 0.1


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_loop_publishes_its_turns_admission_and_the_engine() -> None:
    state = HealthState(max_stall=5.0)
    engine = _Engine()
    executor = offload.get_executor("thread", max_workers=1, max_queue=0)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(keep_current, state, lambda: executor, engine)
            await anyio.sleep(_TURN)
            assert time.monotonic() - state.published.loop_turned_at < _TURN
            assert state.published.engine_error is None
            assert state.published.engine_checked_at > 0
            assert not state.published.refusing
            with executor.admission("test", cost=1):
                await anyio.sleep(_TURN)
                assert state.published.refusing  # the one place is held
            await anyio.sleep(_TURN)
            assert not state.published.refusing
            engine.dead = True
            await anyio.sleep(ENGINE_CHECK_INTERVAL_S + 0.2)
            assert state.published.engine_error == "RuntimeError: engine core died"
            tg.cancel_scope.cancel()
    finally:
        executor.shutdown()


def _may_raise_priority() -> bool:
    """Whether a process here may lower its niceness (the OS allows it: root, `CAP_SYS_NICE`)."""
    code = "import os; os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) - 1)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, check=False).returncode == 0


def test_the_answering_process_runs_above_the_server_where_allowed(health_server: HealthServer) -> None:
    """It asks for `PRIORITY_ABOVE_SERVER` below the server's niceness (the
    server's loop and engine run at it), and gets it where the OS allows;
    it never runs below the server."""
    ours, theirs = os.getpriority(os.PRIO_PROCESS, 0), psutil.Process(health_server.pid).nice()
    if _may_raise_priority():
        assert theirs == max(-20, ours - health_answer.PRIORITY_ABOVE_SERVER)
    else:
        assert theirs == ours


_WITHOUT_CAP_SYS_NICE = """
import os, time, httpx, psutil
from offload_vllm._health import HealthServer, HealthState
state = HealthState(max_stall=3600.0)
server = HealthServer("127.0.0.1", 0, state, "OFFLOAD_VLLM_HEALTH_PORT")
try:
    status = httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=60).status_code
    print(status, os.getpriority(os.PRIO_PROCESS, 0), psutil.Process(server.pid).nice())
finally:
    server.close()
"""


def _drop_cap_sys_nice() -> None:
    """In a child before its exec: take `CAP_SYS_NICE` out of its capability
    bounding set, so that neither it nor what it execs (root included) may
    lower a niceness, as in a container that drops the capability (Docker's
    and Kubernetes' default). Not root: the capability is not there to drop."""
    import ctypes

    pr_capbset_drop, cap_sys_nice = 24, 23  # <linux/prctl.h>, <linux/capability.h>
    if os.geteuid() == 0 and ctypes.CDLL(None, use_errno=True).prctl(pr_capbset_drop, cap_sys_nice, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP, CAP_SYS_NICE)")


def test_where_the_os_refuses_a_higher_priority_the_answering_process_runs_at_the_servers() -> None:
    """Without `CAP_SYS_NICE`, the answering process's `setpriority` is
    refused: it keeps the server's niceness and answers all the same."""
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_CAP_SYS_NICE],
        preexec_fn=_drop_cap_sys_nice,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    status, server_nice, answering_nice = (int(word) for word in done.stdout.split())
    assert status == 200
    assert answering_nice == server_nice


def test_free_port_helper_is_bindable_by_the_health_server() -> None:
    port = free_port()
    server = HealthServer("127.0.0.1", port, HealthState(3600.0), "OFFLOAD_VLLM_HEALTH_PORT")
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=60).status_code == 200
    finally:
        server.close()


def test_sigterm_marks_draining_and_still_does_what_it_did() -> None:
    """The handler set over the one before (vLLM's, through the event loop)
    marks readiness draining and calls it too; set once, however often asked."""
    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        state = HealthState(1.0)
        _mark_draining_on_sigterm(state)
        installed = signal.getsignal(signal.SIGTERM)
        _mark_draining_on_sigterm(state)
        assert signal.getsignal(signal.SIGTERM) is installed
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not seen:  # the handler runs on the main thread, between bytecodes
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert state.draining
        assert seen == [signal.SIGTERM]
        assert state.readiness(time.monotonic())[1]["reason"] == "shutting down"
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_readiness_follows_admission_as_it_changes() -> None:
    """`Health.changed` (called by admission on each change)
    publishes at once, with no turn of the loop's periodic task between."""
    health = Health(0, 5.0, "OFFLOAD_VLLM_HEALTH_PORT")
    executor = offload.get_executor("thread", max_workers=1, max_queue=0)
    try:
        health.changed(executor)
        assert health.state.readiness(time.monotonic())[0] == 200
        with executor.admission("test", cost=1):
            health.changed(executor)
            assert health.state.readiness(time.monotonic())[0] == 503
        health.changed(executor)
        assert health.state.readiness(time.monotonic())[0] == 200
    finally:
        executor.shutdown()


def test_readiness_asks_for_room_for_a_typical_request_and_does_not_flap() -> None:
    """Under a cost bound, readiness turns 503 once a request of the typical
    recent cost would be refused (one of cost 1 would still pass), and turns
    200 again only once twice that cost would be admitted."""
    rates = DrainRates()
    for _ in range(5):
        rates.priced(Priced(300.0))
    assert rates.typical_cost() == pytest.approx(300.0)
    health = Health(0, 5.0, "OFFLOAD_VLLM_HEALTH_PORT", Readiness(rates.typical_cost))
    executor = offload.get_executor("thread", max_workers=1, max_queued_cost=1000)

    def ready() -> int:
        health.changed(executor)
        return health.state.readiness(time.monotonic())[0]

    try:
        assert ready() == 200
        with executor.admission("test", cost=600):
            assert ready() == 200  # room 400: a typical request (300) fits
            with executor.admission("test", cost=200) as second:
                assert not executor.overloaded  # room 200: cost 1 would pass,
                assert ready() == 503  # a typical request would not
                second.release()
                assert ready() == 503  # room 400 again, but not 2 x 300
        assert ready() == 200  # room 1000
    finally:
        executor.shutdown()


def test_under_max_num_queued_reqs_readiness_is_200_as_soon_as_a_typical_request_would_be_admitted() -> None:
    """Under vLLM's `--max-num-queued-reqs` (here 48; typical requests of 16
    engine requests), readiness says 503 while a typical request would be
    refused, and 200 again as soon as one would be admitted: a request
    answered gives back room for one, which the next admission takes, so a
    rule that waited for room for two said 503 while requests were admitted."""
    engine = EngineRequests(limit=48)
    readiness = Readiness(engine=engine, typical_engine_requests=lambda: 16.0)
    executor = offload.get_executor("thread", max_workers=1)
    try:
        with contextlib.ExitStack() as first, contextlib.ExitStack() as others:
            first.enter_context(engine.hold(16))
            for _ in range(2):
                assert (engine.refuses(16), readiness.refuses(executor)) == (False, False)
                others.enter_context(engine.hold(16))
            assert (engine.refuses(16), readiness.refuses(executor)) == (True, True)  # full
            assert readiness.refuses(executor)  # and stays so while nothing is answered
            first.close()  # one answered: room for one typical request
            assert (engine.refuses(16), readiness.refuses(executor)) == (False, False)
            first.enter_context(engine.hold(16))  # which the next one takes
            assert (engine.refuses(16), readiness.refuses(executor)) == (True, True)
        assert engine.held == 0
        assert not readiness.refuses(executor)
    finally:
        executor.shutdown()


def test_the_typical_cost_is_that_of_requests_priced_not_answered() -> None:
    """The typical cost follows the requests priced for admission (admitted
    or refused), the latest weighing most, per lane; answers do not move it,
    and before any request it is 1."""
    rates = DrainRates()
    assert rates.typical_cost() == 1.0
    rates.answered(Priced(50.0))
    assert rates.typical_cost() == 1.0
    rates.priced(Priced(9_000.0))
    assert rates.typical_cost() == pytest.approx(9_000.0)
    rates.priced(Priced(3_000.0, "other"))
    assert rates.typical_cost() == pytest.approx(9_000.0)
    for _ in range(400):
        rates.priced(Priced(100.0))
    assert rates.typical_cost() == pytest.approx(100.0, rel=0.01)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_first_decision_is_refused_with_readiness_at_503() -> None:
    """A cost bound already full below the first request's cost (a call
    holding it, admitted elsewhere): the very first request priced is
    refused, and readiness, judged at that request's own cost, said 503 at
    its decision (with a typical cost of 1 it said 200)."""
    rates = DrainRates()
    health = Health(0, 5.0, "OFFLOAD_VLLM_HEALTH_PORT", Readiness(rates.typical_cost))
    executor = offload.get_executor("thread", max_workers=1, max_queued_cost=1_000)
    policy = RequestPolicy(
        executor_of=lambda: executor,
        router=LaneRouter.of({"default"}, {}),
        engine_priority=False,
        retry_after=rates.retry_after,
        answers=ANSWERS,
    )
    for listener in (rates, health):
        policy.subscribe(listener)

    async def served() -> None:
        raise AssertionError("a refused request was served")

    before = decisions_counted()
    try:
        with executor.admission("test", cost=600):
            health.changed(executor)
            assert health.state.readiness(time.monotonic())[0] == 200  # room 400 >= cost 1
            answer = await policy.admit(None, lambda: 500.0, None, served)
            assert answer.status_code == 503
    finally:
        executor.shutdown()
    after = decisions_counted()
    assert {key: after[key] - before[key] for key in after} == {
        ("admitted", "200"): 0, ("admitted", "503"): 0, ("refused", "200"): 0, ("refused", "503"): 1,
    }


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_typical_cost_counts_the_seams_price_not_the_doors_floor() -> None:
    """A request passes the door (priced at its body's floor, the least its
    bytes can cost) and then the seam (its full cost): only the seam's
    price enters the typical cost, so floors do not pull the mean below
    what requests cost."""
    rates = DrainRates()
    executor = offload.get_executor("thread", max_workers=1, max_queued_cost=10_000_000)
    policy = RequestPolicy(
        executor_of=lambda: executor,
        router=LaneRouter.of({"default"}, {}),
        engine_priority=False,
        retry_after=rates.retry_after,
        answers=ANSWERS,
    )
    policy.subscribe(rates)
    passed: list[str] = []

    async def app(scope: object, receive: object, send: object) -> None:
        passed.append("app")

    scope = {
        "type": "http", "method": "POST", "path": "/v1/embeddings", "root_path": "",
        "headers": [(b"content-length", b"40000")],
    }
    try:
        await RefuseWhenFull(app, policy)(scope, None, None)
        assert passed == ["app"]
        assert rates.typical_cost() == 1.0  # the door's floor is not a price of the request

        async def served() -> str:
            return "served"

        assert await policy.admit(None, lambda: 90_000.0, None, served) == "served"
        assert rates.typical_cost() == pytest.approx(90_000.0)
    finally:
        executor.shutdown()


def decisions_counted() -> dict[tuple[str, str], float]:
    """`(decision, ready)` -> decisions counted so far in this process."""
    from prometheus_client import REGISTRY

    return {
        (decision, ready): REGISTRY.get_sample_value(
            f"{READINESS_AT_ADMISSION}_total", {"decision": decision, "ready": ready}
        ) or 0.0
        for decision in ("admitted", "refused")
        for ready in ("200", "503")
    }


def test_each_admission_decision_counts_what_readiness_published() -> None:
    """`Health.decided` counts, per decision on a default-lane
    request, what `GET /ready` answers from the board at that moment: what
    was published (here, before the bound's filling was), not readiness's
    rule applied afresh; a request of another lane is not counted."""
    health = Health(0, 5.0, "OFFLOAD_VLLM_HEALTH_PORT")
    executor = offload.get_executor("thread", max_workers=1, max_queue=0)
    before = decisions_counted()
    try:
        health.changed(executor)
        with executor.admission("test", cost=1):
            health.decided(Priced(1.0), True)
            # The bound is full, but not published yet: the board still says 200.
            assert executor.would_refuse()
            health.decided(Priced(1.0), False)
            health.changed(executor)
            health.decided(Priced(1.0), False)
            health.decided(Priced(1.0, "default"), False)
            health.decided(Priced(1.0, "other"), False)
    finally:
        executor.shutdown()
    after = decisions_counted()
    assert {key: after[key] - before[key] for key in after} == {
        ("admitted", "200"): 1, ("admitted", "503"): 0, ("refused", "200"): 1, ("refused", "503"): 2,
    }


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_readiness_is_published_before_each_decision() -> None:
    """A place of `max_queue` taken where admission does not see it (a call
    running on the worker) is published before the next request's decision:
    its refusal is counted with 503, not with the 200 published before."""
    health = Health(0, 5.0, "OFFLOAD_VLLM_HEALTH_PORT")
    executor = offload.get_executor("thread", max_workers=1, max_queue=0)
    policy = RequestPolicy(
        executor_of=lambda: executor,
        router=LaneRouter.of({"default"}, {}),
        engine_priority=False,
        retry_after=lambda executor, lane, cost: 1,
        answers=ANSWERS,
    )
    policy.subscribe(health)

    async def served() -> None:
        raise AssertionError("a refused request was served")

    release = threading.Event()
    before = decisions_counted()
    try:
        health.changed(executor)
        executor.submit(release.wait, 30)
        deadline = time.monotonic() + 30
        while not executor.would_refuse():
            assert time.monotonic() < deadline, "the call did not take the place"
            await anyio.sleep(0.01)
        assert health.state.readiness(time.monotonic())[0] == 200  # as published before
        answer = await policy.admit(None, lambda: 1.0, None, served)
        assert answer.status_code == 503
    finally:
        release.set()
        executor.shutdown()
    after = decisions_counted()
    assert {key: after[key] - before[key] for key in after} == {
        ("admitted", "200"): 0, ("admitted", "503"): 0, ("refused", "200"): 0, ("refused", "503"): 1,
    }
