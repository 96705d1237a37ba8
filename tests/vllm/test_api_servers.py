"""The launcher runs vLLM's `vllm serve` path: `--api-server-count 2` starts two
API server processes, the model is positional or `--model`, the start-up
summary is logged once per API server process, and the health port is the
whole server's: one answering process, a loop blocked in either API server
reported, SIGTERM making both say they shut down. Real servers on 127.0.0.1."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

import offload

from ._server import (
    Server,
    api_server_processes,
    free_port,
    servers_started,
    start_server,
)
from .conftest import AVAILABLE

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(900),
    pytest.mark.skipif("thread" not in AVAILABLE, reason="needs the thread strategy"),
]

ONE, TWO = "one API server", "two API servers"
WORKERS = 2
MAX_STALL_S = 2.0

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
            extra_env={"OFFLOAD_VLLM_HEALTH_PORT": str(free_port()), "OFFLOAD_VLLM_HEALTH_MAX_STALL": str(MAX_STALL_S)},
            extra_args=(
                "--api-server-count", "2", "--middleware", "tests.vllm.operator_middleware.BlockLoop",
                # In-flight engine requests drain on SIGTERM (vLLM's default aborts them at once).
                "--shutdown-timeout", "60",
            ),
        ),
    }
    with servers_started(starts) as servers:
        # vLLM's /health answers as soon as one API server accepts: wait for both.
        deadline = time.monotonic() + 120
        while servers[TWO].log.read_text(errors="replace").count(STARTUP_COMPLETE) < 2:
            assert servers[TWO].alive(), servers[TWO].log_tail()
            assert time.monotonic() < deadline, servers[TWO].log_tail()
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
    """API server process id -> its index (vLLM's `ApiServer_<index>`), from the summaries."""
    return {pid: int(name.rpartition("_")[2]) for name, pid, _ in summaries(server)}


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
    """Block each API server's loop in turn for 3x the bound: liveness turns
    503 naming that process (a second client's new connection goes to the
    other process while the first one's stays open: vLLM accepts on the
    least loaded); 200 again after."""
    server = api_servers[TWO]
    indices = index_of(server)
    blocked: list[int] = []
    with httpx.Client(timeout=60) as first, httpx.Client(timeout=60) as second:
        for client in (first, second):
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                sent = time.monotonic()
                blocking = pool.submit(client.post, f"{server.url}/offload-test/block-loop?seconds={3 * MAX_STALL_S}")
                reasons: list[str] = []
                while not blocking.done():
                    code, body = health(server, "/health")
                    if code == 503:
                        reasons.append(body["reason"])
                    time.sleep(0.1)
                response = blocking.result()
            assert response.status_code == 200
            index = indices[int(response.headers["x-pid"])]
            blocked.append(index)
            named = [r for r in reasons if r.startswith(f"API server {index + 1} of 2: the event loop has not turned")]
            assert named, (index, reasons)
            assert all(r.startswith(f"API server {index + 1} of 2: ") for r in reasons), reasons
            assert time.monotonic() - sent >= 3 * MAX_STALL_S
            deadline = time.monotonic() + 10
            while health(server, "/health")[0] != 200:
                assert time.monotonic() < deadline, "liveness did not come back"
                time.sleep(0.05)
    assert sorted(blocked) == [0, 1]


#: Texts that keep the engine busy for a while: vLLM drains them on SIGTERM.
LONG = ["offload keeps the event loop alive " * 40] * 64


def test_sigterm_makes_readiness_503_for_both_api_servers_while_they_drain(api_servers: dict[str, Server]) -> None:
    """The last of the module: SIGTERM to the server (what Kubernetes sends
    its first process) while requests are in the engine of both API servers:
    `/ready` answers 503, both processes shutting down, until the port goes;
    never 200 again after."""
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
    both = [
        body for code, body in seen
        if [entry.get("reason") for entry in body.get("api_servers", [])] == ["shutting down"] * 2
    ]
    assert both, seen
