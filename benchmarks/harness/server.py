"""Start and stop one vLLM server configuration on loopback, in its own process group."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"
# Startup takes ~70 s on an idle 2-core machine and much longer when it is shared.
DEFAULT_READY_TIMEOUT = 600.0
MEMORY_FRACTION = 0.1

#: vLLM's model in its engine core's process, not a worker process of its
#: own, which vLLM's CPU build pins to core 0 and which imports vLLM and torch
#: once more at every start (smoke servers here, every test server).
ENGINE_IN_ONE_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


@dataclass(frozen=True)
class ServerConfig:
    """One row of the tables: how the server is started.

    `strategy` None means unmodified vLLM (no plugin); every row goes through
    the adapter's launcher, `python -m offload_vllm serve`.
    """

    name: str
    strategy: str | None = None
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def command(self, model: Path, port: int) -> list[str]:
        common = [
            "--runner", "pooling", "--dtype", "float32",
            "--host", HOST, "--port", str(port),
            "--disable-uvicorn-access-log",
            # On CPU this is the share of RAM reserved for the KV cache; vLLM's 0.92
            # default fails when other servers share the machine, and pooling needs little.
            "--gpu-memory-utilization", str(MEMORY_FRACTION),
        ]
        # Every row runs vLLM's `vllm serve` path through the adapter's launcher
        # (the `vllm` command fails on the CPU build), so `--api-server-count`
        # is honoured; a "no plugin" row loads no plugin (`environment`).
        head = [sys.executable, "-m", "offload_vllm", "serve", str(model)]
        if self.strategy is not None:
            head += ["--offload-strategy", self.strategy]
        return [*head, *common, *self.extra_args]

    def shown(self) -> str:
        """The command line as a report quotes it (the model and port vary)."""
        return " ".join(["python", *self.command(Path("MODEL"), 8000)[1:]])

    def for_smoke(self) -> ServerConfig:
        """This configuration as a smoke run starts it, which measures nothing:
        without torch.compile (`--enforce-eager`: ~20 s sooner on 2 cores),
        and with the model run in the engine core's process rather than in a
        worker process of its own (`VLLM_ENABLE_V1_MULTIPROCESSING=0` lets
        vLLM's CPU platform keep its one-process executor): one import of
        vLLM and torch fewer at every start. The API server,
        where the adapter runs, is the same process either way. Measured runs
        keep vLLM's defaults: compiled, the model in a worker process."""
        return dataclasses.replace(
            self,
            extra_args=(*self.extra_args, "--enforce-eager"),
            env={**self.env, **ENGINE_IN_ONE_PROCESS},
        )

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        if self.strategy is not None:
            env["OFFLOAD_VLLM_STRATEGY"] = self.strategy
        else:
            # A plugin installed in the venv must not change the "no plugin" rows.
            env["VLLM_PLUGINS"] = ""
            for name in ("OFFLOAD_VLLM_STRATEGY", "VLLM_OFFLOAD_STRATEGY", "OFFLOAD_STRATEGY"):
                env.pop(name, None)
        env.update(self.env)
        return env


#: Where `free_port` looks first: ports from here up to the start of Linux's
#: ephemeral range, which the kernel never hands to an outgoing connection,
#: and above Ray's default worker ports (10002-19999), which a Ray suite
#: running beside binds as its workers start.
LISTEN_PORTS_FROM = 20000


def ephemeral_ports() -> range:
    """The ports Linux gives outgoing connections (and `bind` to port 0) their
    source ports from (`/proc/sys/net/ipv4/ip_local_port_range`; its default
    32768-60999 where that cannot be read)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def free_port() -> int:
    """A port on `HOST` that nothing listens on now, for a server that binds
    it later (a vLLM server binds its health port only once its engine is up,
    seconds to minutes later). Chosen at random below the ephemeral range:
    a port there is never some connection's source port, where a port picked
    by binding port 0 is in that range, and once freed, the next connection
    made on the machine may take it before the server binds it (seen: a
    health port taken so while a server started beside the Ray suite's
    connections). Another process picking the same port in between is left
    to chance: one in about 13,000 a pick. Falls back to port 0's where the
    ephemeral range leaves nothing below it."""
    ephemeral = ephemeral_ports()
    rng = random.SystemRandom()
    for _ in range(100 if ephemeral.start > LISTEN_PORTS_FROM else 0):
        port = rng.randrange(LISTEN_PORTS_FROM, ephemeral.start)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue  # in use (listening, or a connection's own)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _ended(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


def _kill_groups(procs: list[subprocess.Popen[bytes]], grace: float = 20.0) -> None:
    # SIGTERM to each API server alone lets it stop its engine in order, all of
    # them at once (one after the other, a run's shutdown took each one's in
    # turn); then anything left in a group (engine core, workers, extra API
    # servers) is killed.
    running = [proc for proc in procs if proc.poll() is None]
    for proc in running:
        proc.terminate()
    deadline = time.monotonic() + grace
    for proc in running:
        if not _ended(proc, max(0.0, deadline - time.monotonic())):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=grace)
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


class ServerFailed(RuntimeError):
    pass


def wait_healthy(url: str, timeout: float) -> float:
    """Wait until `url`'s `/health` answers 200; the seconds it took. `ServerFailed` after `timeout`."""
    start = time.monotonic()
    while not _healthy(url):
        if time.monotonic() - start > timeout:
            raise ServerFailed(f"{url}: /health did not answer within {timeout:.0f} s")
        time.sleep(0.05)
    return time.monotonic() - start


@contextlib.contextmanager
def _stopped_by_sigterm() -> Iterator[None]:
    """SIGTERM (`kill`, `timeout`) raises SystemExit here, as Ctrl-C raises
    KeyboardInterrupt, so that the servers are stopped on the way out: by
    default it would end this process at once and leave them running, each in
    its own session. Only in the main thread (the one Python delivers signals to)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def running_servers(
    configs: Mapping[str, ServerConfig],
    model: Path,
    log_paths: Mapping[str, Path],
    ready_timeout: float = DEFAULT_READY_TIMEOUT,
    poll_s: float = 0.25,
) -> Iterator[dict[str, tuple[str, int]]]:
    """Every configuration's server, started together: the (URL, API server
    pid) of each by key once all are ready (`/health` asked every `poll_s`).
    A start is mostly one process importing (one core), so on 2 cores two
    start in little more time than one. Every process group is stopped on
    exit; `ServerFailed` if any server exits or is not ready within `ready_timeout`."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_stopped_by_sigterm())
        started: dict[str, tuple[str, subprocess.Popen[bytes]]] = {}
        procs: list[subprocess.Popen[bytes]] = []
        stack.callback(_kill_groups, procs)
        for key, config in configs.items():
            port = free_port()
            log_paths[key].parent.mkdir(parents=True, exist_ok=True)
            with open(log_paths[key], "wb") as log:
                proc = subprocess.Popen(
                    config.command(model, port),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=config.environment(),
                    start_new_session=True,
                )
            procs.append(proc)
            started[key] = (f"http://{HOST}:{port}", proc)
        deadline = time.monotonic() + ready_timeout
        waiting = dict(started)
        while waiting:
            for key, (url, proc) in list(waiting.items()):
                if _healthy(url):
                    del waiting[key]
                elif proc.poll() is not None:
                    raise ServerFailed(
                        f"{configs[key].name}: server exited with {proc.returncode}; see {log_paths[key]}"
                    )
            if waiting and time.monotonic() > deadline:
                names = ", ".join(configs[key].name for key in waiting)
                raise ServerFailed(f"{names}: not ready after {ready_timeout:.0f} s; see {log_paths}")
            if waiting:
                time.sleep(poll_s)
        yield {key: (url, proc.pid) for key, (url, proc) in started.items()}
