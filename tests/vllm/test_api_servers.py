"""The launcher runs vLLM's `vllm serve` path: `--api-server-count 2` starts two
API server processes, the model is positional or `--model`, the start-up
summary is logged once per API server process, and the health port is the
whole server's: one answering process, a loop blocked in either API server
reported, SIGTERM making both say they shut down. Real servers on 127.0.0.1."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from offload_vllm import _shared_board

import offload
from offload.testing import shm_files

from ._server import (
    Server,
    api_server_processes,
    free_port,
    good_retry_after,
    group_pids,
    renderer_workers,
    scrape,
    servers_started,
    start_server,
    total,
)
from .conftest import AVAILABLE

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(900),
    pytest.mark.skipif("thread" not in AVAILABLE, reason="needs the thread strategy"),
]

ONE, TWO, KILLED = "one API server", "two API servers", "two API servers, one to be killed"
WORKERS = 2
MAX_STALL_S = 2.0
#: A request of the flood: 64 texts of about 180 tokens each (the test model keeps 256).
FLOODING = ["offload keeps the event loop alive " * 25] * 64


def _flooding_cost() -> float:
    """What admission charges one flooding request (`_seams/requests.request_cost`)."""
    from offload_vllm._seams.requests import request_cost
    from vllm.entrypoints.pooling.embed.protocol import EmbeddingCompletionRequest

    body = {"model": "m", "input": FLOODING}
    return request_cost(EmbeddingCompletionRequest(**body), len(json.dumps(body)))


#: The two API servers' cost bound, set once for the server: 4.5 flooding requests
#: (each process admits two of them, within its half; without the split, four).
SERVER_BOUND = 4.5 * _flooding_cost()

#: The start-up summary: `(APIServer pid=7) INFO ... offload-vllm: thread started 2 workers in 0.01s, ...`.
SUMMARY = re.compile(r"\((\w+) pid=(\d+)\).*offload-vllm: thread started (.*)$", re.MULTILINE)
STARTUP_COMPLETE = "Application startup complete"


@pytest.fixture(scope="module")
def api_servers(model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    """The default (one API server, the model positional, `WORKERS` workers),
    and two API servers (the model given as `--model`, the workers' default),
    started together."""
    start = functools.partial(start_server, model_dirs["embed"], "minilm", "thread")
    starts = {
        ONE: functools.partial(start, tmp_path_factory.mktemp("one-api-server"), workers=WORKERS),
        TWO: functools.partial(
            start, tmp_path_factory.mktemp("two-api-servers"), model_flag=True,
            extra_env={
                "OFFLOAD_VLLM_HEALTH_PORT": str(free_port()), "OFFLOAD_VLLM_HEALTH_MAX_STALL": str(MAX_STALL_S),
                "OFFLOAD_VLLM_MAX_QUEUED_COST": str(SERVER_BOUND),
            },
            extra_args=(
                "--api-server-count", "2", "--middleware", "tests.vllm.operator_middleware.BlockLoop",
                # In-flight engine requests drain on SIGTERM (vLLM's default aborts them at once).
                "--shutdown-timeout", "60",
            ),
        ),
    }
    if "process" in AVAILABLE:
        # Worker processes and the health port's: all that a killed API server could leave.
        starts[KILLED] = functools.partial(
            start_server, model_dirs["embed"], "minilm", "process", tmp_path_factory.mktemp("killed-api-server"),
            extra_env={"OFFLOAD_VLLM_HEALTH_PORT": str(free_port())}, extra_args=("--api-server-count", "2"),
        )
    with servers_started(starts) as servers:
        # vLLM's /health answers as soon as one API server accepts: wait for both.
        deadline = time.monotonic() + 120
        for name in {TWO, KILLED} & servers.keys():
            while servers[name].log.read_text(errors="replace").count(STARTUP_COMPLETE) < 2:
                assert servers[name].alive(), servers[name].log_tail()
                assert time.monotonic() < deadline, servers[name].log_tail()
                time.sleep(0.5)
        yield servers


def embed(server: Server) -> None:
    r = httpx.post(f"{server.url}/v1/embeddings", json={"model": server.model, "input": ["a", "b"]}, timeout=60)
    assert r.status_code == 200, r.text
    assert len(r.json()["data"]) == 2


def test_two_api_server_processes_run_and_serve(api_servers: dict[str, Server]) -> None:
    server = api_servers[TWO]
    processes = api_server_processes(server)
    print(f"\n[--api-server-count 2] {[' '.join(p.info['cmdline']) for p in processes]}")  # noqa: T201
    assert len(processes) == 2, server.log_tail()
    assert all(p.ppid() == server.proc.pid for p in processes)
    for _ in range(8):
        embed(server)


def test_one_api_server_is_the_servers_own_process(api_servers: dict[str, Server]) -> None:
    server = api_servers[ONE]
    assert api_server_processes(server) == []
    assert server.log.read_text(errors="replace").count(STARTUP_COMPLETE) == 1
    embed(server)


def summaries(server: Server) -> list[tuple[str, int, str]]:
    """(process name, pid, what follows `thread started `) of each summary line."""
    return [(m[1], int(m[2]), m[3]) for m in SUMMARY.finditer(server.log.read_text(errors="replace"))]


def test_one_summary_from_the_api_server(api_servers: dict[str, Server]) -> None:
    server = api_servers[ONE]
    lines = summaries(server)
    assert len(lines) == 1, server.log_tail()
    name, pid, rest = lines[0]
    print(f"\n[summary] {rest}")  # noqa: T201 (the line a reader checks)
    assert (name, pid) == ("APIServer", server.proc.pid)
    # The workers started (the setting), the express worker, and the inline cost.
    assert rest.startswith(f"{WORKERS} workers in "), rest
    assert re.match(rf"{WORKERS} workers in [0-9.]+s, and the express worker; ", rest), rest
    assert f" workers={WORKERS} " in rest
    assert re.search(r" express_cost=[0-9.]+ ", rest), rest
    assert re.search(r" inline_cost=[0-9.]+ ", rest), rest
    assert "API server" not in rest
    log = server.log.read_text(errors="replace")
    assert "pooling pre/post-processing" not in log  # the old per-process line


def test_one_summary_per_api_server_saying_which(api_servers: dict[str, Server]) -> None:
    server = api_servers[TWO]
    lines = summaries(server)
    print("\n" + "\n".join(f"[summary] {name}: {rest}" for name, _, rest in lines))  # noqa: T201
    assert sorted(name for name, _, _ in lines) == ["ApiServer_0", "ApiServer_1"], server.log_tail()
    assert {pid for _, pid, _ in lines} == {p.pid for p in api_server_processes(server)}
    assert sorted(rest.rpartition("; ")[2] for _, _, rest in lines) == ["API server 1 of 2", "API server 2 of 2"]
    # Each process's pool defaults to its share of the host's cores, and says so.
    cores = offload.strategy.usable_cpu_count()
    share = max(1, cores // 2)
    for _, _, rest in lines:
        assert rest.startswith(f"{share} worker{'' if share == 1 else 's'} in "), rest
        assert f" workers={share}(default: {cores} cores / 2 API servers) " in rest, rest


def health(server: Server, path: str) -> tuple[int, dict[str, Any]]:
    response = httpx.get(f"http://127.0.0.1:{server.env['OFFLOAD_VLLM_HEALTH_PORT']}{path}", timeout=10)
    return response.status_code, response.json()


def index_of(server: Server) -> dict[int, int]:
    """API server process id -> its index (vLLM's `ApiServer_<index>`), from the log's line prefixes."""
    found = re.findall(r"\(ApiServer_(\d+) pid=(\d+)\)", server.log.read_text(errors="replace"))
    return {int(pid): int(index) for index, pid in found}


def answering_processes(server: Server) -> list[psutil.Process]:
    return [
        p for p in psutil.Process(server.proc.pid).children(recursive=True)
        if any(part.endswith("_health_answer.py") for part in p.cmdline())
    ]


def test_one_health_port_answers_for_both_api_servers(api_servers: dict[str, Server]) -> None:
    server = api_servers[TWO]
    deadline = time.monotonic() + 60
    while (answer := health(server, "/ready"))[0] != 200:  # the second may join a moment after the first
        assert time.monotonic() < deadline, answer
        time.sleep(0.2)
    code, body = health(server, "/health")
    assert (code, body["api_servers"]) == (200, [{"status": "ok"}, {"status": "ok"}]), body
    assert answer[1]["api_servers"] == [{"status": "ready"}, {"status": "ready"}]
    # One answering process, the first API server's child.
    [answering] = answering_processes(server)
    first = next(pid for pid, index in index_of(server).items() if index == 0)
    assert answering.ppid() == first
    log = server.log.read_text(errors="replace")
    assert "health endpoints /health and /ready on 127.0.0.1:" in log
    assert "for the 2 API server processes" in log
    assert "API server 2 of 2 publishes to the health port" in log
    assert "Address already in use" not in log


def test_a_loop_blocked_in_either_api_server_is_reported_naming_it(api_servers: dict[str, Server]) -> None:
    """Block one API server's loop for 6 s and, 3 s in, the other's for 8 s
    (a new connection then goes to the other: the blocked one cannot accept
    it): liveness is 503 naming the first alone, then both, then the second
    alone, each process's own status in `api_servers`; 200 again after."""
    server = api_servers[TWO]
    indices = index_of(server)
    seen: list[tuple[int, list[str], str]] = []

    def block(seconds: float) -> httpx.Response:
        return httpx.post(f"{server.url}/offload-test/block-loop?seconds={seconds}", timeout=60)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        began = time.monotonic()
        first = pool.submit(block, 6.0)
        second = None
        while not (first.done() and second is not None and second.done()):
            if second is None and time.monotonic() - began >= 3.0:
                second = pool.submit(block, 8.0)
            code, body = health(server, "/health")
            seen.append((code, [entry["status"] for entry in body["api_servers"]], body.get("reason", "")))
            time.sleep(0.1)
        x, y = (indices[int(f.result().headers["x-pid"])] for f in (first, second))
    assert {x, y} == {0, 1}, (x, y)

    def alone(index: int) -> list[str]:
        statuses = ["ok", "ok"]
        statuses[index] = "unhealthy"
        return [r for code, s, r in seen if code == 503 and s == statuses]

    for index in (x, y):
        assert alone(index), (index, seen)
        assert all(r.startswith(f"API server {index + 1} of 2: the event loop has not turned") for r in alone(index))
    assert any(s == ["unhealthy", "unhealthy"] for _, s, _ in seen), seen
    deadline = time.monotonic() + 10
    while health(server, "/health")[0] != 200:
        assert time.monotonic() < deadline, "liveness did not come back"
        time.sleep(0.05)


def test_the_servers_cost_bound_holds_over_both_api_servers(api_servers: dict[str, Server]) -> None:
    """`OFFLOAD_VLLM_MAX_QUEUED_COST` is the server's: each API server admits
    within its half (the summaries say so), so under a flood of 24 requests at
    once the cost held, summed over both processes (`offload_lane_queued_cost`,
    live-summed across them), never passes the bound, while both hold some
    (as the admitted requests, summed likewise, say);
    the rest are refused with 503 and a computed `Retry-After`, and all is
    given back after."""
    server = api_servers[TWO]
    for name, _, rest in summaries(server):
        assert f" max_queued_cost={SERVER_BOUND / 2:g}(server: {SERVER_BOUND:g} / 2 API servers) " in rest, (name, rest)
    body = {"model": server.model, "input": FLOODING}
    held: list[float] = []
    done = threading.Event()

    admitted: list[float] = []

    def watch() -> None:
        while not done.is_set():
            values = scrape(server)
            held.append(total(values, "offload_lane_queued_cost"))
            admitted.append(total(values, "offload_vllm_admitted_requests"))

    with concurrent.futures.ThreadPoolExecutor(25) as pool:
        watcher = pool.submit(watch)
        # A client each: new connections, spread over both processes.
        sent = [pool.submit(httpx.post, f"{server.url}/v1/embeddings", json=body, timeout=120) for _ in range(24)]
        answers = [future.result() for future in sent]
        done.set()
        watcher.result()
    statuses = sorted(r.status_code for r in answers)
    print(f"\n[server bound {SERVER_BOUND:g}] {statuses}; held max {max(held):g} of {len(held)} readings")  # noqa: T201
    assert set(statuses) == {200, 503}, statuses
    assert all(good_retry_after(r.headers.get("retry-after")) for r in answers if r.status_code == 503)
    assert max(held) <= SERVER_BOUND, held
    assert max(held) > SERVER_BOUND / 2, held  # both processes held requests at once
    # The admitted requests, summed over both processes too (multiprocess mode).
    assert 3 <= max(admitted) <= statuses.count(200), admitted
    values = scrape(server)
    assert (total(values, "offload_lane_queued_cost"), total(values, "offload_vllm_admitted_requests")) == (0, 0)


def test_a_killed_api_server_process_leaves_nothing_behind(api_servers: dict[str, Server]) -> None:
    """SIGKILL one of two API server processes (`process`, the health port)
    while requests are in flight: vLLM stops the whole server, and nothing of
    it is left: no process of its group (engine, the other API server,
    renderer workers, the health port's answering process), no shared-memory
    file of offload's, no abstract socket of the health port's."""
    if KILLED not in api_servers:
        pytest.skip("process is not available")
    server = api_servers[KILLED]
    port = int(server.env["OFFLOAD_VLLM_HEALTH_PORT"])
    deadline = time.monotonic() + 60
    while health(server, "/ready")[0] != 200:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    name = f"@{_shared_board.rendezvous_name(port, parent=server.proc.pid)[1:]}"
    assert name in Path("/proc/net/unix").read_text()
    pids = group_pids(server.proc.pid) | {server.proc.pid}
    assert len(answering_processes(server)) == 1
    workers = renderer_workers(server)
    assert len(workers) >= 2, workers  # at least one per API server process (2 cores / 2)
    assert {worker.pid for worker in workers} <= pids
    victim = next(pid for pid, index in index_of(server).items() if index == 1)
    body = {"model": server.model, "input": FLOODING}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        sent = [pool.submit(httpx.post, f"{server.url}/v1/embeddings", json=body, timeout=60) for _ in range(4)]
        time.sleep(0.5)
        os.kill(victim, signal.SIGKILL)
        for future in sent:
            with contextlib.suppress(httpx.HTTPError):
                future.result()
    server.proc.wait(timeout=120)
    deadline = time.monotonic() + 20
    while left := {pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE}:
        assert time.monotonic() < deadline, [psutil.Process(pid).cmdline() for pid in left if psutil.pid_exists(pid)]
        time.sleep(0.2)
    assert shm_files(pids) == []
    assert name not in Path("/proc/net/unix").read_text()


#: Texts that keep the engine busy for a while: vLLM drains them on SIGTERM.
LONG = FLOODING


def test_sigterm_makes_readiness_503_for_both_api_servers_while_they_drain(api_servers: dict[str, Server]) -> None:
    """The last of the module: SIGTERM to the server (what Kubernetes sends
    its first process) while requests are in the engine of both API servers:
    `/ready` answers 503 until the port goes, never 200 again, and each
    process's entry says it is shutting down."""
    server = api_servers[TWO]
    assert health(server, "/ready")[0] == 200
    body = {"model": server.model, "input": LONG, "truncate_prompt_tokens": 200}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        # A client each: new connections, spread over both processes.
        sent = [pool.submit(httpx.post, f"{server.url}/v1/embeddings", json=body, timeout=120) for _ in range(8)]
        time.sleep(1.0)
        os.kill(server.proc.pid, signal.SIGTERM)
        seen: list[tuple[int, dict[str, Any]]] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the port goes, or 5 s of 503s
            try:
                seen.append(health(server, "/ready"))
            except httpx.TransportError:
                break
            if seen[-1][0] == 503 and deadline - time.monotonic() > 5:
                deadline = time.monotonic() + 5
            time.sleep(0.02)
        for future in sent:
            with contextlib.suppress(httpx.HTTPError):
                future.result()
    codes = [code for code, _ in seen]
    assert 503 in codes, seen
    assert 200 not in codes[codes.index(503):], seen
    reasons = [[entry.get("reason") for entry in body["api_servers"]] for _, body in seen if "api_servers" in body]
    for index in (0, 1):
        assert any(r[index] == "shutting down" for r in reasons), (index, reasons)
