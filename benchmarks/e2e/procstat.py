"""CPU time of a vLLM API server's parts, read from `/proc` (Linux).

A snapshot splits the server's process tree into: the event-loop thread (the
API server's main thread: vLLM runs uvicorn's loop there), the whole
API-server process (its own threads, children excluded), offload's renderer
worker processes (their title starts with `offload-vllm::renderer`), and
everything else below the API server (vLLM's engine core and model worker,
multiprocessing's helpers). The difference of two snapshots over a block of
load, divided by the requests it completed, is CPU per request.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

#: How offload's `process` workers show in `ps` (offload_vllm._workers.PROCESS_TITLE).
WORKER_TITLE = "offload-vllm::renderer"
_TICK = os.sysconf("SC_CLK_TCK")


def _stat_cpu(path: str) -> float:
    """utime + stime (seconds) from a `/proc/.../stat` file; 0 if it is gone."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return 0.0
    # The command name (field 2) may hold spaces: count fields after its ")".
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


@dataclass(frozen=True)
class Snapshot:
    loop: float
    api: float
    workers: dict[int, float]
    engine: dict[int, float]


def snapshot(api_pid: int) -> Snapshot:
    workers: dict[int, float] = {}
    engine: dict[int, float] = {}
    try:
        children = psutil.Process(api_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    for child in children:
        try:
            title = " ".join(child.cmdline())
        except psutil.Error:
            continue
        cpu = _stat_cpu(f"/proc/{child.pid}/stat")
        (workers if title.startswith(WORKER_TITLE) else engine)[child.pid] = cpu
    return Snapshot(
        loop=_stat_cpu(f"/proc/{api_pid}/task/{api_pid}/stat"),
        api=_stat_cpu(f"/proc/{api_pid}/stat"),
        workers=workers,
        engine=engine,
    )


def _grown(before: dict[int, float], after: dict[int, float]) -> float:
    # A process that appeared during the block counts from zero; one that
    # vanished is lost (nothing should die during a block).
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def cpu_used(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds each part used between two snapshots."""
    used = {
        "loop": after.loop - before.loop,
        "api": after.api - before.api,
        "workers": _grown(before.workers, after.workers),
        "engine": _grown(before.engine, after.engine),
    }
    used["total"] = used["api"] + used["workers"] + used["engine"]
    return used


def new_workers(before: Snapshot, after: Snapshot) -> int:
    """Worker processes that appeared between the snapshots (spawned under load)."""
    return len(set(after.workers) - set(before.workers))
