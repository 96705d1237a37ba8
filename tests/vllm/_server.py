"""A real vLLM server in a subprocess on 127.0.0.1, in its own process group."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.harness import server as harness_server
from offload.testing import shm_files

from ._server_fork import ForkedProcess, forked

K = TypeVar("K")

READY_TIMEOUT_S = float(os.environ.get("OFFLOAD_TEST_VLLM_READY_TIMEOUT", "420"))

#: The engine's model worker runs in the engine core's process (vLLM's `uni`
#: executor) rather than a process of its own (the CPU build's `mp` executor).
#: That executor pins the worker's threads to one core, reserving the other
#: for the frontend (`reserved_cpus=[1]` in the engine's log; every
#: `VLLM::Worker` thread's `Cpus_allowed_list` is `0`): with the suite's ten
#: servers up, every forward pass of every server ran on core 0, beside the
#: other lane of `make test`. A third process also costs its own import of
#: vLLM and torch at every start.
#: The API server and its engine core stay two processes (vLLM's server
#: always runs them apart), and the adapter runs in the first: nothing it does
#: is left out. In test_offline's `LLM(...)` runs the engine and the model
#: then run in the caller's process, the harder case for the `process`
#: strategy (vLLM's config holds the live model; see there).
ENGINE_IN_ONE_PROCESS = harness_server.ENGINE_IN_ONE_PROCESS

#: In every test server's environment.
COMMON_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **ENGINE_IN_ONE_PROCESS}


def load_client(connections: int, timeout: float = 300) -> httpx.AsyncClient:
    """An async client for load on a loopback server.

    Idle connections expire here (1 s) before uvicorn's keep-alive (5 s) closes
    them on the server's side, so no request goes out on a connection the
    server is closing: that race is a ReadError which says nothing about the
    server's answers.
    """
    limits = httpx.Limits(max_connections=connections, keepalive_expiry=1.0)
    return httpx.AsyncClient(timeout=timeout, limits=limits)


free_port = harness_server.free_port


def group_pids(pgid: int) -> set[int]:
    """The live processes of process group `pgid` (the server, its engine,
    its renderer workers): what `stop()` signals."""
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    pids.add(int(entry))
            except OSError:
                pass
    return pids


@dataclass
class Server:
    url: str
    model: str
    #: Forked from the session's forker (`_server_fork`), or a fresh interpreter.
    proc: subprocess.Popen[bytes] | ForkedProcess
    log: Path
    #: The server's environment, as it started.
    env: Mapping[str, str] = field(default_factory=dict)
    #: offload's shared-memory files that outlived the server (`stop()` sets it).
    shm_left: tuple[str, ...] = ()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 60) -> str:
        """The log's last `n` lines, after its error lines from further up: a
        failed engine logs its cause long before the API server's traceback."""
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        earlier = [line for line in lines[:-n] if re.search(r"\bERROR\b|Error:", line)][-40:]
        if earlier:
            return "\n".join(["[error lines further up]", *earlier, "[last lines]", *lines[-n:]])
        return "\n".join(lines[-n:])

    def stop(self) -> None:
        # The group's pids while it runs: once stopped, their files are orphans.
        pids = group_pids(self.proc.pid) | {self.proc.pid}
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # stragglers: engine core, workers
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        left = shm_files(pids)
        if left:
            self.shm_left = (*self.shm_left, *(path.name for path in left))
            for path in left:  # reported by `servers_started`; not left on the host
                with contextlib.suppress(OSError):
                    path.unlink()


def start_server(
    model_dir: Path, name: str, strategy: str | None, log_dir: Path, *, workers: int | None = None,
    extra_env: dict[str, str] | None = None, extra_args: tuple[str, ...] = (), fresh: bool = False,
    model_flag: bool = False,
) -> Server:
    """Start a server and return at once (`wait_ready` waits for it). It is
    forked from the session's forker (`_server_fork`) unless `fresh`: then,
    as for a user, a new interpreter runs `python -m offload_vllm serve`
    (vLLM's `vllm serve` path). The model is positional, or `--model` if `model_flag`."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_OFFLOAD_", "OFFLOAD_"))}
    env.update(COMMON_ENV)
    env.update(extra_env or {})
    args = [sys.executable, "-m", "offload_vllm", "serve", *(["--model"] if model_flag else []), str(model_dir)]
    if strategy is not None:
        args += ["--offload-strategy", strategy]
    if workers is not None:
        args += ["--offload-workers", str(workers)]
    args += [
        "--runner", "pooling", "--dtype", "float32", "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", name, "--max-model-len", "256", "--max-num-seqs", "64",
        # An explicit KV cache size: the test models are encoders and use none.
        # With the CPU backend's default (a share of the NUMA node's memory,
        # `--gpu-memory-utilization`), every engine checks at start that this
        # share is still free on the node: with several servers starting
        # together late in a long test run, that check can fail.
        "--kv-cache-memory-bytes", "64M",
        # The suite tests the frontend: skip torch.compile warm-up (~100 s per server here).
        "--enforce-eager",
        *extra_args,
    ]
    log = log_dir / f"{name}-{strategy or 'vllm'}.log"
    proc: subprocess.Popen[bytes] | ForkedProcess | None = None if fresh else forked(args, env, log, COMMON_ENV)
    if proc is None:
        with log.open("wb") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return Server(url=f"http://127.0.0.1:{port}", model=name, proc=proc, log=log, env=env)


@contextlib.contextmanager
def servers_started(starts: Mapping[K, Callable[[], Server]]) -> Iterator[dict[K, Server]]:
    """Start every server of `starts` (each `start()` returns at once), wait
    until all are ready, together; stop them all when the block ends, however
    it ends (a server that failed to start included).

    Once they are stopped, fails if offload left a shared-memory file of any
    of them behind (`Server.shm_left`). vLLM's own segments are not checked:
    its engine and model worker make one `multiprocessing.shared_memory`
    segment each (the executor's message queues) and do not remove them when
    stopped by a signal; Python's resource tracker removes them, with its
    "leaked shared_memory objects" warning in the server's log."""
    started: dict[K, Server] = {}
    try:
        for key, start in starts.items():
            started[key] = start()
        with concurrent.futures.ThreadPoolExecutor(len(started)) as pool:
            list(pool.map(wait_ready, started.values()))
        yield started
    finally:
        for server in started.values():
            server.stop()
    left = {key: server.shm_left for key, server in started.items() if server.shm_left}
    assert not left, f"offload's shared-memory files outlived their servers: {left}"


def wait_ready(server: Server) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if not server.alive():
            raise RuntimeError(f"server exited with {server.proc.returncode}:\n{server.log_tail()}")
        try:
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    server.stop()
    raise RuntimeError(f"server not ready after {READY_TIMEOUT_S}s:\n{server.log_tail()}")


MetricValues = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(server: Server) -> MetricValues:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    values: MetricValues = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            values[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return values


def total(values: MetricValues, name: str, **labels: str) -> float:
    return sum(
        v for (n, ls), v in values.items() if n == name and all((k, labels[k]) in ls for k in labels)
    )


def _is_worker_of(proc: psutil.Process, session: int, title: str) -> bool:
    try:
        return os.getsid(proc.pid) == session and " ".join(proc.info["cmdline"] or []).startswith(title)
    except (ProcessLookupError, psutil.Error):
        return False


#: The title vLLM gives each of `--api-server-count` N > 1 API server
#: processes (`VLLM::APIServer_0`, ...); with one, the server's own process serves.
API_SERVER_TITLE = "VLLM::APIServer_"


def api_server_processes(server: Server) -> list[psutil.Process]:
    """The server's API server processes that vLLM started beside its own (N > 1)."""
    session = os.getsid(server.proc.pid)
    return [p for p in psutil.process_iter(["cmdline"]) if _is_worker_of(p, session, API_SERVER_TITLE)]


def renderer_workers(server: Server) -> list[psutil.Process]:
    """The server's `process` workers that are ready: a worker shows
    `PROCESS_TITLE` once its initializer has run (a replacement takes seconds)."""
    # Imported here: it imports vLLM, which this module (loaded by conftest) must not.
    from offload_vllm._workers import PROCESS_TITLE

    session = os.getsid(server.proc.pid)
    return [p for p in psutil.process_iter(["cmdline"]) if _is_worker_of(p, session, PROCESS_TITLE)]


def good_retry_after(value: str | None) -> bool:
    """A computed `Retry-After`: whole seconds from 1 to the cap."""
    from offload_vllm._retry_after import RETRY_AFTER_CAP_S

    return value is not None and value.isascii() and value.isdigit() and 1 <= int(value) <= RETRY_AFTER_CAP_S
