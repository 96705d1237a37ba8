"""The health endpoints' thread and what it answers (`offload_vllm._health`),
without a vLLM server: the state the loop publishes, read by a real HTTP
server in its thread. End to end, on a real server: `test_operations.py`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import anyio
import httpx
import pytest
from offload_vllm._health import (
    ENGINE_CHECK_INTERVAL_S,
    HealthServer,
    HealthState,
    _mark_draining_on_sigterm,
    keep_current,
)

import offload

from ._server import free_port


@pytest.fixture
def served() -> Iterator[tuple[HealthState, str]]:
    state = HealthState(max_stall=1.0)
    server = HealthServer("127.0.0.1", 0, state, "OFFLOAD_VLLM_HEALTH_PORT")
    try:
        yield state, f"http://127.0.0.1:{server.port}"
    finally:
        server.close()


def test_liveness_and_readiness_read_what_the_loop_published(served: tuple[HealthState, str]) -> None:
    state, url = served
    state.loop_turned_at = time.monotonic()
    state.engine_checked_at = time.monotonic()
    live, ready = httpx.get(f"{url}/health"), httpx.get(f"{url}/ready")
    assert (live.status_code, live.json()["status"]) == (200, "ok")
    assert (ready.status_code, ready.json()["status"]) == (200, "ready")
    assert live.headers["content-type"] == "application/json"

    state.refusing = True
    ready = httpx.get(f"{url}/ready")
    assert ready.status_code == 503
    assert "admission refuses" in ready.json()["reason"]
    assert httpx.get(f"{url}/health").status_code == 200  # busy is alive
    state.refusing = False

    state.draining = True
    assert httpx.get(f"{url}/ready").json()["reason"] == "shutting down"
    state.draining = False

    state.engine_error = "EngineDeadError"
    live = httpx.get(f"{url}/health")
    assert live.status_code == 503
    assert live.json()["reason"] == "the engine is not alive: EngineDeadError"
    assert httpx.get(f"{url}/ready").status_code == 503
    state.engine_error = None

    state.loop_turned_at = time.monotonic() - 3
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


#: Probes `url` 50 times from its own process (as a kubelet probes from
#: outside), printing the slowest answer in seconds; fails on any non-200.
PROBE = """
import sys, time, http.client
from urllib.parse import urlsplit
where = urlsplit(sys.argv[1])
worst = 0.0
for _ in range(50):
    began = time.perf_counter()
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
    connection.request("GET", "/health")
    status = connection.getresponse().status
    connection.close()
    worst = max(worst, time.perf_counter() - began)
    assert status == 200, status
    time.sleep(0.02)
print(worst)
"""


def test_the_health_thread_answers_while_threads_flood_the_gil(served: tuple[HealthState, str]) -> None:
    """Two threads of this process spinning in Python bytecode (a GIL-bound
    flood, one per core here) while a probe from another process asks 50
    times: every probe is answered, each within 2 s (a wide margin: on this
    shared 2-core machine, loaded, the slowest of 50 took 0.04 s beside one
    spinning thread, 0.37-0.39 s beside two, 0.01 s alone; every GIL hand-off
    an answer needs waits for the spinners' switch interval)."""
    state, url = served
    state.max_stall = 3600.0  # the loop's side is not under test here
    stop = threading.Event()
    spinners = [threading.Thread(target=_spin, args=(stop,)) for _ in range(2)]
    for spinner in spinners:
        spinner.start()
    try:
        probe = subprocess.run(
            [sys.executable, "-c", PROBE, url], capture_output=True, text=True, timeout=120, check=False
        )
    finally:
        stop.set()
        for spinner in spinners:
            spinner.join()
    assert probe.returncode == 0, probe.stderr
    assert float(probe.stdout) < 2.0


class _Engine:
    def __init__(self) -> None:
        self.dead = False

    async def check_health(self) -> None:
        if self.dead:
            raise RuntimeError("engine core died")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_loop_publishes_its_turns_admission_and_the_engine() -> None:
    state = HealthState(max_stall=5.0)
    engine = _Engine()
    executor = offload.get_executor("thread", max_workers=1, max_queue=0)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(keep_current, state, lambda: executor, engine)
            await anyio.sleep(0.1)
            assert time.monotonic() - state.loop_turned_at < 0.1
            assert state.engine_error is None
            assert state.engine_checked_at > 0
            assert not state.refusing
            with executor.admission("test", cost=1):
                await anyio.sleep(0.1)
                assert state.refusing  # the one place is held
            await anyio.sleep(0.1)
            assert not state.refusing
            engine.dead = True
            await anyio.sleep(ENGINE_CHECK_INTERVAL_S + 0.2)
            assert state.engine_error == "RuntimeError: engine core died"
            tg.cancel_scope.cancel()
    finally:
        executor.shutdown()


def test_free_port_helper_is_bindable_by_the_health_server() -> None:
    port = free_port()
    server = HealthServer("127.0.0.1", port, HealthState(1.0), "OFFLOAD_VLLM_HEALTH_PORT")
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
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
