"""One health port for several API server processes (`offload_vllm._shared_board`,
`HealthState.share`/`adopt`), without a vLLM server: the whole server's
answers over every process's board, read by the real answering process, and
how sibling processes meet, in real processes. End to end, with
`--api-server-count 2`: `test_api_servers.py`."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from offload_vllm import _shared_board
from offload_vllm._health import HealthServer, HealthState

from ._server import free_port

pytestmark = pytest.mark.skipif(not _shared_board.SUPPORTED, reason="the API server processes meet on Linux only")


@pytest.fixture
def three() -> Iterator[tuple[list[HealthState], str]]:
    """The first of three API server processes' state, serving, and the two
    others' states adopting its boards (in this process: each through a
    descriptor of its own, as the others receive one)."""
    first = HealthState(max_stall=3600.0)
    first.share(3)
    others = [HealthState(max_stall=3600.0) for _ in range(2)]
    for index, state in enumerate(others, start=1):
        state.adopt(os.dup(first.fd), 3, index)
    server = HealthServer("127.0.0.1", 0, first, "OFFLOAD_VLLM_HEALTH_PORT")
    try:
        url = f"http://127.0.0.1:{server.port}"
        assert httpx.get(f"{url}/health", timeout=60).status_code == 200
        now = time.monotonic()
        for state in (first, *others):
            # A bound a loaded machine cannot pass by accident between two steps.
            state.publish(max_stall=30.0, loop_turned_at=now, engine_checked_at=now)
        yield [first, *others], url
    finally:
        server.close()


def test_the_answers_are_the_whole_servers_and_name_the_process_that_fails(
    three: tuple[list[HealthState], str],
) -> None:
    states, url = three
    live, ready = httpx.get(f"{url}/health"), httpx.get(f"{url}/ready")
    assert (live.status_code, live.json()["status"]) == (200, "ok")
    assert live.json()["api_servers"] == [{"status": "ok"}] * 3
    assert (ready.status_code, ready.json()["status"]) == (200, "ready")

    states[1].publish(refusing=True)
    ready = httpx.get(f"{url}/ready")
    assert ready.status_code == 503
    assert ready.json()["reason"].startswith("API server 2 of 3: admission refuses new requests")
    assert httpx.get(f"{url}/health").status_code == 200
    states[1].publish(refusing=False)

    states[2].draining = True
    ready = httpx.get(f"{url}/ready").json()
    assert ready["reason"] == "API server 3 of 3: shutting down"
    assert ready["api_servers"][1:] == [{"status": "ready"}, {"status": "not ready", "reason": "shutting down"}]
    assert states[0].readiness(time.monotonic())[0] == 503  # what the first's admission counts reads too
    # Shutting down is said first: the engine stops on the way, and that is no fault.
    states[2].publish(engine_error="EngineDeadError")
    assert httpx.get(f"{url}/ready").json()["reason"] == "API server 3 of 3: shutting down"
    assert httpx.get(f"{url}/health").json()["reason"] == "API server 3 of 3: the engine is not alive: EngineDeadError"
    states[2].publish(engine_error=None)
    states[2].draining = False

    states[2].publish(loop_turned_at=time.monotonic() - 60)
    live = httpx.get(f"{url}/health")
    assert live.status_code == 503
    assert live.json()["reason"].startswith("API server 3 of 3: the event loop has not turned for 60.")
    assert live.json()["loop_turned_seconds_ago"] >= 60  # the oldest of the three
    assert httpx.get(f"{url}/ready").status_code == 503
    states[2].publish(loop_turned_at=time.monotonic())

    states[0].publish(engine_error="EngineDeadError")
    assert httpx.get(f"{url}/health").json()["reason"] == "API server 1 of 3: the engine is not alive: EngineDeadError"
    states[0].publish(engine_error=None)
    assert httpx.get(f"{url}/health").status_code == 200


def test_a_process_that_never_joins_is_reported_once_the_bound_has_passed() -> None:
    first = HealthState(max_stall=0.5)
    first.share(2)
    first.publish(loop_turned_at=time.monotonic() + 60, engine_checked_at=time.monotonic())
    assert first.liveness(time.monotonic())[0] == 200
    time.sleep(0.6)
    code, body = first.liveness(time.monotonic())
    assert code == 503
    assert body["reason"].startswith("API server 2 of 2: the event loop has not turned for 0.")


#: A process of the test's: `host PORT COUNT` makes the boards and hands them
#: out, then prints `/ready`'s reason whenever it reads a line; `join PORT
#: INDEX COUNT` joins, publishes `refusing`, says so, and waits to be killed.
SIBLING = textwrap.dedent(
    """
    import sys, time
    from offload_vllm._health import HealthState
    from offload_vllm import _shared_board
    role, port, rest = sys.argv[1], int(sys.argv[2]), [int(a) for a in sys.argv[3:]]
    state = HealthState(3600.0)
    if role == "host":
        state.share(rest[0])
        host = _shared_board.BoardHost(state.fd, rest[0], port)
        print("listening", flush=True)
        for _ in sys.stdin:
            print(sorted(host.joined), state.readiness(time.monotonic())[1].get("reason"), flush=True)
    else:
        index, count = rest
        try:
            fd = _shared_board.join(port, index)
        except RuntimeError as exc:
            print(exc, flush=True)
            sys.exit(3)
        state.adopt(fd, count, index)
        state.publish(refusing=True)
        print("joined", flush=True)
        time.sleep(3600)
    """
)


def sibling(*args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", SIBLING, *map(str, args)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)},
    )


@contextlib.contextmanager
def killed_at_end(*processes: subprocess.Popen[str]) -> Iterator[None]:
    try:
        yield
    finally:
        for process in processes:
            process.kill()
            process.communicate()


def abstract_sockets() -> str:
    return Path("/proc/net/unix").read_text()


def test_siblings_meet_and_publish_into_the_first_ones_boards_and_nothing_is_left() -> None:
    port = free_port()
    host = sibling("host", port, 3)
    with killed_at_end(host):
        assert host.stdout is not None
        assert host.stdin is not None
        assert host.stdout.readline().strip() == "listening"
        name = _shared_board.rendezvous_name(port, parent=os.getpid())[1:]
        assert f"@{name}" in abstract_sockets()
        # One joins before the other; the second retries until... it is already listening here.
        joiners = [sibling("join", port, index, 3) for index in (2, 1)]
        with killed_at_end(*joiners):
            for joiner in joiners:
                assert joiner.stdout is not None
                assert joiner.stdout.readline().strip() == "joined"
            host.stdin.write("\n")
            host.stdin.flush()
            assert host.stdout.readline().strip().startswith("[1, 2] API server 2 of 3: admission refuses")
            # The boards outlive a joiner's end (the first maps them).
            joiners[1].send_signal(signal.SIGKILL)
            joiners[1].wait()
            host.stdin.write("\n")
            host.stdin.flush()
            assert "API server 2 of 3: admission refuses" in host.stdout.readline()
        host.kill()
        host.wait()
        # The name is in no file system, and went with the process.
        assert f"@{name}" not in abstract_sockets()


def test_what_is_not_a_sibling_or_names_no_other_index_is_refused() -> None:
    port = free_port()
    host = sibling("host", port, 2)
    with killed_at_end(host):
        assert host.stdout is not None
        assert host.stdout.readline().strip() == "listening"
        outside = sibling("join", port, 2, 2)  # index 2 of 2: there is none
        with killed_at_end(outside):
            assert outside.stdout is not None
            assert "refused: index 2 is not 1..1" in outside.stdout.readline()
            assert outside.wait(timeout=30) == 3
        # This process is the first's parent, not its sibling: it gets no
        # descriptor, and is told so before it says anything.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(_shared_board.rendezvous_name(port, parent=os.getpid()))
            connection.settimeout(30)
            message, fds, _, _ = socket.recv_fds(connection, 256, 1)
        assert fds == []
        assert message.startswith(b"refused: not an API server process of this server")


def test_a_process_that_starts_before_the_first_listens_joins_once_it_does() -> None:
    port = free_port()
    joiner = sibling("join", port, 1, 2)
    with killed_at_end(joiner):
        time.sleep(1.0)  # retrying all along
        assert joiner.poll() is None
        host = sibling("host", port, 2)
        with killed_at_end(host):
            assert joiner.stdout is not None
            assert joiner.stdout.readline().strip() == "joined"


def test_off_linux_the_health_port_with_several_api_servers_is_refused_naming_both_flags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from offload_vllm._health import refuse_beside_api_servers
    from offload_vllm._parsers import OffloadVLLMConfigError

    refuse_beside_api_servers(8001, 2)  # here: shared
    monkeypatch.setattr(_shared_board, "SUPPORTED", False)
    refuse_beside_api_servers(8001, 1)  # one process never needs to meet
    with pytest.raises(OffloadVLLMConfigError, match=r"--offload-health-port \(OFFLOAD_VLLM_HEALTH_PORT=8001\) cannot be used "
                       r"with --api-server-count 2 on .*abstract Unix sockets"):
        refuse_beside_api_servers(8001, 2)


#: Two processes as two API servers in Prometheus's multiprocess mode (vLLM's
#: with `--api-server-count` > 1): each holds `argv[2]` requests of 3 engine
#: requests in its own `EngineRequests`, reported, then says so and waits.
HOLDER = textwrap.dedent(
    """
    import contextlib, sys, time
    from offload_vllm._admission import EngineRequests, report
    engine = EngineRequests()
    report(engine)
    with contextlib.ExitStack() as held:
        for _ in range(int(sys.argv[2])):
            held.enter_context(engine.hold(3))
        print("held", flush=True)
        sys.stdin.readline()
    print("released", flush=True)
    sys.stdin.readline()
    """
)


def test_what_admitted_requests_hold_is_summed_over_api_servers_in_multiprocess_mode(tmp_path: Path) -> None:
    """The admitted-requests gauges are set at each change, so Prometheus's
    multiprocess collector (which never reads a gauge's function) sums them
    over the processes, as they change."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path), "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}

    def collected() -> dict[str, float]:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(tmp_path))
        return {
            sample.name: sample.value
            for family in registry.collect() for sample in family.samples
            if sample.name.startswith("offload_vllm_admitted")
        }

    holders = [
        subprocess.Popen([sys.executable, "-c", HOLDER, "x", str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=env)
        for n in (2, 5)
    ]
    with killed_at_end(*holders):
        for holder in holders:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "held"
        assert collected() == {"offload_vllm_admitted_requests": 7, "offload_vllm_admitted_engine_requests": 21}
        holder = holders[1]
        assert holder.stdin is not None
        assert holder.stdout is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "released"
        assert collected() == {"offload_vllm_admitted_requests": 2, "offload_vllm_admitted_engine_requests": 6}
