"""The launcher runs vLLM's `vllm serve` path: `--api-server-count 2` starts two
API server processes, the model is positional or `--model`, the start-up
summary is logged once per API server process, and what cannot work with
several (the health port) is refused at start, by the launcher and, on vLLM's
own serve path, by the API server processes. Real servers on 127.0.0.1."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import offload

from ._server import (
    COMMON_ENV,
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
            start, tmp_path_factory.mktemp("two-api-servers"), model_flag=True, extra_args=("--api-server-count", "2")
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


def launch(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python -m offload_vllm serve ARGS...` in a fresh interpreter, as a user runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OFFLOAD_", "VLLM_OFFLOAD_"))} | COMMON_ENV
    return subprocess.run(
        [sys.executable, "-m", "offload_vllm", "serve", *args],
        capture_output=True, text=True, timeout=timeout, env=env, check=False,
    )


@pytest.mark.parametrize("model_flag", [False, True], ids=["positional", "--model"])
def test_the_health_port_with_two_api_servers_is_refused_at_start(model_dirs: dict[str, Path], model_flag: bool) -> None:
    port = free_port()
    model = ["--model", str(model_dirs["embed"])] if model_flag else [str(model_dirs["embed"])]
    done = launch(
        *model, "--offload-strategy", "thread", "--offload-health-port", str(port),
        "--runner", "pooling", "--api-server-count", "2", "--port", str(free_port()),
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert (
        f"offload-vllm: --offload-health-port (OFFLOAD_VLLM_HEALTH_PORT={port}) cannot be used with "
        "--api-server-count 2: each API server process would bind the same port" in done.stderr
    ), done.stderr[-3000:]
    # Refused before vLLM started anything: no engine, no API server.
    assert "EngineCore" not in done.stderr
    assert STARTUP_COMPLETE not in done.stderr


#: vLLM's own `vllm serve` path, as a GPU build's `vllm serve ARGS...` runs it,
#: without the launcher (and its early refusal) in front.
VLLM_SERVE = "import sys; from offload_vllm._seams.serve_command import run_serve; run_serve(sys.argv[1:])"


def test_on_vllms_own_serve_path_each_api_server_refuses_the_health_port(model_dirs: dict[str, Path]) -> None:
    """A server started without the launcher (`vllm serve --api-server-count 2`
    with `OFFLOAD_VLLM_HEALTH_PORT` set) is refused too, by the API server
    processes as they bind the port: the server exits, naming both flags,
    rather than one process failing with EADDRINUSE while the other serves."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OFFLOAD_", "VLLM_OFFLOAD_"))} | COMMON_ENV
    env |= {"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_WORKERS": "1", "OFFLOAD_VLLM_HEALTH_PORT": str(port)}
    args = [
        sys.executable, "-c", VLLM_SERVE, str(model_dirs["embed"]), "--runner", "pooling", "--dtype", "float32",
        "--host", "127.0.0.1", "--port", str(free_port()), "--max-model-len", "256",
        "--kv-cache-memory-bytes", "64M", "--enforce-eager", "--api-server-count", "2",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=600)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    text = output.decode(errors="replace")
    assert proc.returncode != 0, text[-3000:]
    refusal = (
        f"--offload-health-port (OFFLOAD_VLLM_HEALTH_PORT={port}) cannot be used with --api-server-count 2: "
        "each API server process would bind the same port"
    )
    assert refusal in text, text[-3000:]
    assert "Address already in use" not in text, text[-3000:]
    assert STARTUP_COMPLETE not in text, text[-3000:]
