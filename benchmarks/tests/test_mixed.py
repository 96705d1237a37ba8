"""The mixed-traffic benchmark's parts that need no vLLM: which rows today's adapter
can run, the request tally (lost and unsent requests included), the small requests'
Poisson schedule, pausing the idle servers, and verdicts from made-up rounds."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import pickle
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
import unittest.mock
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.harness import idle_servers, load, mixed, raw_http, workloads
from benchmarks.harness.server import ServerFailed
from benchmarks.suites import mixed as bench_mixed
from benchmarks.tests.loopback import loopback_server, read_head

#: How long a prober test probes: at its 10 ms interval, over 100 probes on
#: an idle machine; beside the vLLM suite on 2 cores a side process may get a
#: fifth of that (0.3 s once gave 2 dropped connections where a test needs 3).
PROBING_S = 1.5


def test_the_report_names_each_rows_command() -> None:
    plain = bench_mixed.ROWS["thread lanes"].config.shown()
    assert plain.startswith("python -m offload_vllm serve MODEL --offload-strategy thread")
    assert "--offload-scheduling fifo" in bench_mixed.ROWS["thread fifo"].config.shown()


def test_vllm_default_is_vllms_serve_path_with_no_plugin_loaded() -> None:
    default = bench_mixed.ROWS[bench_mixed.DEFAULT].config
    plain = default.command(Path("MODEL"), 8000)
    assert plain[1:5] == ["-m", "offload_vllm", "serve", "MODEL"]
    assert not any(arg.startswith("--offload-") for arg in plain)
    assert default.environment()["VLLM_PLUGINS"] == ""


def block(alone_ms: float, flooded_ms: float, heavy_per_s: float, health_ms: float | None = None) -> dict[str, Any]:
    """One round of a row; `health_ms`: /health p99 until the answer arrived
    (None: a result from before that was measured)."""
    def phase(p50: float, per_s: float) -> dict[str, Any]:
        return {"sent": 10, "statuses": {"200": 10}, "lost": 0, "ok": 10, "p50_ms": p50, "p99_ms": 2 * p50,
                "max_ms": 2 * p50, "requests_per_s": per_s, "first_error": ""}

    return {"alone": phase(alone_ms, 100.0), "flooded": phase(flooded_ms, 10.0),
            "heavy": phase(500.0, heavy_per_s),
            "health": {"p99_ms": 5.0, "failures": 0.0} if health_ms is None
            else {"p99_ms": health_ms, "p99_arrived_ms": health_ms, "failures": 0.0}}


def test_verdicts_come_from_the_rounds() -> None:
    blocks = {
        bench_mixed.DEFAULT: [block(10, 1000 + r, 20, health_ms=12 + r) for r in range(5)],
        "thread fifo": [block(10, 600 + r, 20, health_ms=15 + r) for r in range(5)],
        "thread lanes": [block(10, 20 + r, 18.6 + 0.1 * r, health_ms=9 + r) for r in range(5)],
    }
    evaluated = [bench_mixed.evaluate(t, blocks) for t in bench_mixed.targets(list(blocks))]
    results = {(t["row"], t["metric"], t["baseline"]): t for t in evaluated}
    assert results[(bench_mixed.DEFAULT, "p50_ratio", None)]["met"] is False
    lanes = results[("thread lanes", "p50_ratio", None)]
    assert lanes["met"] is True
    assert lanes["interval"]["median"] == pytest.approx(2.2)
    assert results[("thread lanes", "heavy_per_s", "thread fifo")]["met"] is False  # 0.94x < 0.95x
    assert results[("thread lanes", "heavy_per_s", bench_mixed.DEFAULT)]["met"] is True  # 0.94x >= 0.9x
    # /health: at most max(10 ms, the default's median, 14 ms), judged on the row's own values.
    health = {row: results[(row, "health_p99_arrived_ms", None)] for row in ("thread fifo", "thread lanes")}
    assert (health["thread fifo"]["bound"], health["thread fifo"]["met"]) == (14, False)  # 17 ms
    assert (health["thread lanes"]["bound"], health["thread lanes"]["met"]) == (14, True)  # 11 ms
    assert (bench_mixed.DEFAULT, "health_p99_arrived_ms", None) not in results  # not judged against itself
    assert bench_mixed.verdict_line(health["thread lanes"]).endswith(
        "<= 14 ms: 11.0 [9.0, 13.0] ms — **met**"
    )
    # The floor holds where the default's own /health is faster.
    quick = {**blocks, bench_mixed.DEFAULT: [block(10, 1000 + r, 20, health_ms=3) for r in range(5)]}
    floor = bench_mixed.evaluate(next(t for t in bench_mixed.targets(list(quick))
                                      if t.metric == "health_p99_arrived_ms" and t.row == "thread lanes"), quick)
    assert (floor["bound"], floor["met"]) == (10, False)  # 11 ms > 10 ms
    summary = bench_mixed.summarize(blocks)
    assert {(p["row"], p["baseline"]) for p in summary["pairs"]} == {
        ("thread fifo", bench_mixed.DEFAULT), ("thread lanes", bench_mixed.DEFAULT), ("thread lanes", "thread fifo"),
    }
    assert summary["rows"]["thread lanes"]["counts"]["heavy"] == {
        "sent": 50, "statuses": {"200": 50}, "lost": 0, "unsent": 0,
    }
    assert summary["rows"]["thread lanes"]["small_sent"] == {"alone": [10] * 5, "flooded": [10] * 5}
    line = bench_mixed.verdict_line(lanes)
    assert "**met**" in line
    assert "2.20" in line
    # An interval across the bound is not met, whatever side the median is on.
    crossing = {**lanes, "interval": {"median": 2.9, "low": 2.5, "high": 3.4}}
    assert bench_mixed.verdict_line(crossing).endswith("**not met by the interval**: it crosses 3 (median below)")


@pytest.mark.parametrize(("path", "status"), [("/ok", "200"), ("/busy", "503"), ("/drop", None)])
def test_tally_counts_every_answer_and_every_lost_request(answering_server: str, path: str, status: str | None) -> None:
    tally = mixed.Tally()
    asyncio.run(mixed.closed_loop(answering_server + path, [b"{}"], 2, lambda: tally.sent < 6, tally))
    assert tally.sent == 6
    if status is None:
        assert tally.lost == 6
        assert tally.first_error
    else:
        assert tally.statuses == {status: 6}
        assert tally.lost == 0
    assert len(tally.latencies_s) == (6 if status == "200" else 0)
    summary = tally.summary((0.0, float("inf")))
    assert summary["lost"] == tally.lost


@contextlib.contextmanager
def _stamping_on(url: str) -> Iterator[None]:
    """Within it, the kernel stamps received packets. Linux stamps them while
    any socket asks for it, and turns stamping on, and off once the last
    such socket is gone, a moment later (deferred work, which can take long
    on a busy machine): one asking socket is held open throughout, so that
    the sockets the test opens and closes never let stamping go off and come
    back late (2 answers of 20 came unstamped once, in a clean-clone run),
    and a connection is tried until its answer is stamped."""
    with raw_http.connect(url, timeout=10):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with raw_http.connect(url, timeout=10) as sock:
                answer, _ = raw_http.exchange(sock, raw_http.request_bytes("GET", url + "/ok"))
            if answer.arrived is not None:
                break
            time.sleep(0.05)
        yield


@pytest.mark.parametrize(("path", "status"), [("/ok", "200"), ("/busy", "503"), ("/drop", None)])
def test_the_timed_client_counts_every_answer_and_when_it_arrived(
    answering_server: str, path: str, status: str | None
) -> None:
    """The plain-socket open loop tallies as aiohttp's does, and reads when each
    200 reached its socket: no later than the client saw it, for nearly all."""
    with _stamping_on(answering_server):
        tally = mixed.run_open_timed(answering_server + path, [b"{}"], [0.01 * n for n in range(20)])
    assert tally.sent == 20
    assert tally.unsent == 0
    if status is None:
        assert tally.lost == 20
        assert "ConnectionError" in tally.first_error
    else:
        assert tally.statuses == {status: 20}
        assert tally.lost == 0
    if status != "200":
        assert tally.latencies_s == tally.arrivals_s == []
        assert "p99_arrived_ms" not in tally.summary((0.0, float("inf")))
        return
    assert len(tally.arrivals_s) == len(tally.latencies_s) == 20
    timed = [(a, lat) for a, lat in zip(tally.arrivals_s, tally.latencies_s, strict=True) if a is not None]
    assert len(timed) >= load.ARRIVALS_NEEDED * 20
    assert all(0 <= arrived <= latency + 1e-3 for arrived, latency in timed)
    summary = tally.summary((0.0, float("inf")))
    assert 0 < summary["p99_arrived_ms"] <= summary["p99_ms"] + 1.0
    assert pickle.loads(pickle.dumps(tally)) == tally  # as the flood sends its tally back


def test_the_timed_client_sends_no_more_than_max_in_flight(answering_server: str) -> None:
    """Due while `max_in_flight` wait for their answers: counted unsent, not sent."""
    # /slow answers after 0.5 s: the last is due long after, however busy the machine.
    tally = mixed.run_open_timed(answering_server + "/slow", [b"{}"], [0.0, 0.05, 0.1, 3.0], max_in_flight=1)
    assert (tally.sent, tally.unsent) == (2, 2)
    assert tally.statuses == {"200": 2}
    # The first answer's arrival includes the server's 0.5 s.
    assert all(a is None or a >= 0.5 for a in tally.arrivals_s)


def test_the_timed_client_reuses_no_connection_the_server_closes(answering_server: str) -> None:
    """An answer with `Connection: close` gives its connection up: the next
    request opens another instead of failing on the closed one."""
    tally = mixed.run_open_timed(answering_server + "/close", [b"{}"], [0.02 * n for n in range(10)])
    assert tally.statuses == {"200": 10}
    assert tally.lost == 0


def test_the_timed_client_counts_a_body_it_cannot_read_as_lost(answering_server: str) -> None:
    tally = mixed.run_open_timed(answering_server + "/chunked", [b"{}"], [0.0, 0.05])
    assert tally.sent == tally.lost == 2
    assert "ValueError" in tally.first_error
    assert "chunked" in tally.first_error


def test_the_timed_client_counts_a_request_past_its_timeout_as_lost(
    answering_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that never answers: each request's socket times out for real
    (the timeout shortened from 120 s), is counted lost with its error, and
    the client returns instead of waiting on."""
    monkeypatch.setattr(mixed, "REQUEST_TIMEOUT_S", 0.3)
    began = time.monotonic()
    tally = mixed.run_open_timed(answering_server + "/hang", [b"{}"], [0.0, 0.05, 0.1])
    assert tally.sent == tally.lost == 3
    assert tally.statuses == {}
    assert "TimeoutError" in tally.first_error
    assert time.monotonic() - began < 3  # within the 0.3 s timeouts, not 120 s


def test_poisson_schedule_is_seeded_at_its_rate_with_exponential_gaps() -> None:
    rate, seconds = 10.0, 2000.0
    times = mixed.poisson_arrivals(rate, seconds, random.Random(7))
    assert times == mixed.poisson_arrivals(rate, seconds, random.Random(7))
    assert times != mixed.poisson_arrivals(rate, seconds, random.Random(8))
    assert times == sorted(times)
    assert 0 < times[0]
    assert times[-1] < seconds
    assert 0.9 * rate < len(times) / seconds < 1.1 * rate
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    mean = statistics.fmean(gaps)
    # An exponential distribution's standard deviation is its mean, and e^-1 of it lies above the mean.
    assert 0.8 < statistics.pstdev(gaps) / mean < 1.2
    assert 0.3 < sum(g > mean for g in gaps) / len(gaps) < 0.45


def test_every_row_gets_the_same_small_schedule_in_a_round() -> None:
    traffic = bench_mixed.SmallTraffic(rate=10.0, seed=3)
    alone = traffic.schedule(100.0, 0, "alone")
    assert alone == bench_mixed.SmallTraffic(rate=10.0, seed=3).schedule(100.0, 0, "alone")
    assert alone != traffic.schedule(100.0, 0, "flooded")
    assert alone != traffic.schedule(100.0, 1, "alone")
    assert alone != bench_mixed.SmallTraffic(rate=10.0, seed=4).schedule(100.0, 0, "alone")


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _wait_state(pid: int, stopped: bool) -> bool:
    deadline = time.monotonic() + 10  # signals arrive within milliseconds; this bounds a hang
    while (_state(pid) == "T") != stopped:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def two_groups() -> Iterator[list[int]]:
    """Two processes, each leading its own process group (as the servers do)."""
    code = "import time\nwhile True: time.sleep(0.01)"
    procs = [subprocess.Popen([sys.executable, "-c", code], start_new_session=True) for _ in range(2)]
    yield [proc.pid for proc in procs]
    for proc in procs:
        proc.kill()
        proc.wait()


def _fail_while_paused(servers: dict[str, tuple[str, int]]) -> None:
    """Serve `a` then `b` with the others paused, checking who is stopped; fail while serving `b`."""
    (_, a), (_, b) = servers["a"], servers["b"]
    with idle_servers.IdleServers(servers) as idle:
        assert _wait_state(a, stopped=True)
        assert _wait_state(b, stopped=True)
        with idle.serving("a"):
            assert _wait_state(a, stopped=False)
            assert _state(b) == "T"
            before = idle.others_cpu("a")
            time.sleep(0.2)
            assert idle.others_cpu("a") == before  # a stopped process uses no CPU
        assert _wait_state(a, stopped=True)
        with idle.serving("b"):
            raise RuntimeError("the run failed")


def test_idle_servers_stay_stopped_and_are_all_resumed(answering_server: str, two_groups: list[int]) -> None:
    a, b = two_groups
    servers = {"a": (answering_server, a), "b": (answering_server, b)}
    with pytest.raises(RuntimeError, match="the run failed"):
        _fail_while_paused(servers)
    assert _wait_state(a, stopped=False)
    assert _wait_state(b, stopped=False)


def test_a_resumed_server_that_does_not_answer_fails_the_run(two_groups: list[int]) -> None:
    # Nothing listens on the port: the server "resumed" never answers /health.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    a, b = two_groups
    servers = {"a": (dead, a), "b": (dead, b)}
    with (
        pytest.raises(ServerFailed, match="did not answer"),
        unittest.mock.patch.object(idle_servers, "RESUME_TIMEOUT_S", 0.5),
        idle_servers.IdleServers(servers) as idle,
        idle.serving("a"),
    ):
        pytest.fail("the block ran although the server did not answer")
    assert _wait_state(a, stopped=False)  # resumed all the same
    assert _wait_state(b, stopped=False)


def _result(blocks: dict[str, list[dict[str, Any]]], **method: Any) -> dict[str, Any]:
    machine = {"cpus": 2, "platform": "Linux", "date": "today", "commit": "abc", "versions": {"vllm": "0"}}
    return {
        "variant": "preprocess", "command": "python -m benchmarks mixed", "machine": machine, "dirty": False,
        "loadavg_before": "0", "loadavg_after": "0", "rounds": 5, "seconds": 5.0, "ramp_s": 1.0, "small": dataclasses.asdict(bench_mixed.SmallTraffic()),
        "heavy_clients": 8, "wall_s": 1.0, "startup_s": 1.0, "blocks": blocks,
        "summary": bench_mixed.summarize(blocks), "targets": [],
        "servers": {row: {"command": "python -m vllm"} for row in blocks}, **method,
    }


def test_the_report_says_how_small_requests_were_sent_and_what_idle_servers_cost() -> None:
    blocks = {
        bench_mixed.DEFAULT: [
            {**block(10, 1000, 20), "idle_cpu_per_s": {"alone": 0.001 * r, "flooded": 0.0}} for r in range(5)
        ]
    }
    report = bench_mixed.markdown(_result(blocks))
    assert "Small requests: open-loop, Poisson arrivals at 10/s" in report
    assert "with 8 closed-loop heavy clients (after a 1 s ramp)" in report
    assert "stopped (SIGSTOP)" in report
    assert "idle servers paused" in report
    assert "0.004 at most" in report
    assert "| 10 10 10 10 10; 10 10 10 10 10 |" in report


def test_the_prober_reads_when_each_answer_arrived(answering_server: str) -> None:
    with _stamping_on(answering_server), load.HealthProber(answering_server) as prober:
        time.sleep(PROBING_S)
    health = prober.summary()
    assert health["failures"] == 0
    assert len(prober.arrivals) == len(prober.latencies) > 5
    timed = [(a, lat) for a, lat in zip(prober.arrivals, prober.latencies, strict=True) if a is not None]
    assert len(timed) >= load.ARRIVALS_NEEDED * len(prober.latencies)
    assert health["without_arrival"] == len(prober.latencies) - len(timed)
    # The kernel's wall clock against the prober's monotonic one: equal within a millisecond.
    assert all(0 <= arrived <= latency + 1e-3 for arrived, latency in timed)
    assert 0 < health["p99_arrived_ms"] <= health["p99_ms"] + 1.0


@pytest.mark.skipif(load.autogroup() is None, reason="this kernel has no autogroups to compare")
def test_the_prober_probes_from_a_session_and_scheduling_group_of_its_own(answering_server: str) -> None:
    """As a kubelet probes from a process of its own: not in the scheduling
    group of the process driving the load (nor of its clients' processes)."""
    build = workloads.bodies(workloads.text_bodies, "m", count=1, inputs=1, words=3)
    with load.HealthProber(answering_server) as prober, mixed.Flood(answering_server + "/ok", build, 1) as flood:
        assert prober.pid is not None
        assert flood.pid is not None
        assert os.getsid(prober.pid) == prober.pid
        assert load.autogroup(prober.pid) not in {load.autogroup(), load.autogroup(flood.pid)}
    assert prober.failures == 0
    assert prober.latencies


_PROBER_THEN_SLEEP = """
import sys, time
from benchmarks.harness import load
prober = load.HealthProber(sys.argv[1]).__enter__()
print(prober.pid, flush=True)
time.sleep(600)
"""


def test_the_prober_stops_by_itself_once_the_benchmark_is_killed(answering_server: str) -> None:
    """In a session of its own, a Ctrl-C or a kill of the benchmark does not
    reach it: it must notice its parent is gone and stop, not probe forever."""
    driver = subprocess.Popen(
        [sys.executable, "-c", _PROBER_THEN_SLEEP, answering_server],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2],
    )
    with driver:
        try:
            assert driver.stdout is not None
            prober = int(driver.stdout.readline())
            assert os.getsid(prober) == prober
        finally:
            driver.kill()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.kill(prober, 0)
        except ProcessLookupError:
            return
        if Path(f"/proc/{prober}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return  # ended; its new parent has not reaped it yet
        time.sleep(0.1)
    os.kill(prober, signal.SIGKILL)
    pytest.fail("the prober was still probing a minute after the benchmark was killed")


@contextlib.contextmanager
def _one_answer_per_connection(headers: bytes) -> Iterator[str]:
    """A loopback server that answers one `/health` per connection (with
    `headers` besides its length), then closes it."""

    def answer_once(conn: socket.socket) -> None:
        with conn:
            if read_head(conn) is not None:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + headers + b"\r\n{}")

    with loopback_server(answer_once) as url:
        yield url


@pytest.fixture
def hanging_up_server() -> Iterator[str]:
    """Closes each connection after one answer, without saying so."""
    with _one_answer_per_connection(b"") as url:
        yield url


def test_the_prober_counts_a_dropped_connection_and_probes_on(hanging_up_server: str) -> None:
    with load.HealthProber(hanging_up_server) as prober:
        time.sleep(PROBING_S)
    # Every second probe finds its connection closed: a failure, then a fresh connection answers.
    assert prober.failures >= 3
    assert len(prober.latencies) >= 3
    assert len(prober.arrivals) == len(prober.latencies)


@pytest.fixture
def closing_server() -> Iterator[str]:
    """Closes each connection after one answer that says so (as the health port does)."""
    with _one_answer_per_connection(b"Connection: close\r\n") as url:
        yield url


def test_the_prober_connects_anew_where_the_answer_says_it_closes(closing_server: str) -> None:
    """No probe is sent on a connection its server said it closes: none fails."""
    with load.HealthProber(closing_server) as prober:
        time.sleep(PROBING_S)
    assert prober.failures == 0
    assert len(prober.latencies) >= 5


def test_the_figures_until_the_answer_arrived_are_reported_and_judged() -> None:
    def arrived(b: dict[str, Any], alone: float, flooded: float, health: float) -> dict[str, Any]:
        return {**b, "alone": {**b["alone"], "p50_arrived_ms": alone / 2, "p99_arrived_ms": alone},
                "flooded": {**b["flooded"], "p50_arrived_ms": flooded / 2, "p99_arrived_ms": flooded * 3},
                "health": {**b["health"], "p99_arrived_ms": health}}

    blocks = {bench_mixed.DEFAULT: [arrived(block(10, 1000, 20), 8, 800, 4.0) for _ in range(5)],
              "thread lanes": [arrived(block(10, 100, 80), 8, 16, 3.0) for _ in range(5)]}
    report = bench_mixed.markdown(_result(blocks))
    assert "| 2.00 [2.00, 2.00] | 6.00 [6.00, 6.00] | 3.0 [3.0, 3.0] |" in report
    summary = bench_mixed.summarize(blocks)
    pair = next(p for p in summary["pairs"] if p["row"] == "thread lanes")
    assert pair["ratios"]["health_p99_arrived_ms"]["median"] == pytest.approx(0.75)
    verdicts = {(t.row, t.metric): bench_mixed.evaluate(t, blocks) for t in bench_mixed.targets(list(blocks))}
    assert verdicts[("thread lanes", "p50_ratio_arrived")]["met"] is True  # 2x <= 3x
    assert verdicts[("thread lanes", "p99_ratio_arrived")]["met"] is False  # 6x > 5x


# A benchmark that starts one server (a small HTTP server answering /health, and
# a child of its own in its process group), prints the server's pid, and waits.
BENCHMARK_WITH_A_SERVER = """
import dataclasses, sys, time
from pathlib import Path
from benchmarks.harness import server

SERVE = '''
import http.server, subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
'''

class Fake(server.ServerConfig):
    def command(self, model, port):
        return [sys.executable, "-c", SERVE, str(port)]

log = Path(sys.argv[1])
with server.running_servers({"fake": Fake("fake")}, Path("."), {"fake": log}) as running:
    print(running["fake"][1], flush=True)
    time.sleep(600)
"""


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_benchmark_stopped_by_sigterm_stops_its_servers(tmp_path: Path) -> None:
    bench = subprocess.Popen([sys.executable, "-c", BENCHMARK_WITH_A_SERVER, str(tmp_path / "server.log")],
                             stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        assert bench.stdout is not None
        pid = int(bench.stdout.readline())
        assert _group_alive(pid)
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(60) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 30
        while _group_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _group_alive(pid)  # the server and its child, not just the benchmark
    finally:
        bench.kill()
        bench.wait(10)
        if bench.stdout is not None:
            bench.stdout.close()
