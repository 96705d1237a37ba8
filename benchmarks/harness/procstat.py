"""CPU time of a vLLM API server's parts, read from `/proc` (Linux).

A snapshot splits the server's process tree into: the event-loop thread (the
API server's main thread: vLLM runs uvicorn's loop there), the whole
API-server process (its own threads, children excluded), offload's renderer
worker processes (their title starts with `offload-vllm::renderer`), and
everything else below the API server (vLLM's engine core and model worker,
multiprocessing's helpers), of which the engine core (`VLLM::EngineCore`)
apart. With `--api-server-count N` the process started serves nothing: its
children titled `VLLM::APIServer_<i>` are the API servers, and the loop and
API-server figures add up theirs. The difference of two snapshots over a block
of load, divided by the requests it completed, is CPU per request.

`group_cpu` adds up the CPU of every process in some process groups (a
server started in its own session: its API server, engine core and workers),
for what servers that take no traffic burn meanwhile.

For the event-loop thread it also keeps the kernel's share of its CPU (`stime`).
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

import psutil

#: How offload's `process` workers show in `ps` (offload_vllm._workers.PROCESS_TITLE).
WORKER_TITLE = "offload-vllm::renderer"
#: How vLLM titles its processes (`vllm.utils.system_utils.set_process_title`).
API_SERVER_TITLE = "VLLM::APIServer"
ENGINE_CORE_TITLE = "VLLM::EngineCore"
_TICK = os.sysconf("SC_CLK_TCK")


def _stat_fields(path: str) -> list[str] | None:
    """The fields of a `/proc/.../stat` file after the command name (state,
    ppid, pgrp, ...); None if it is gone."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces: count fields after its ")".
    return text[text.rindex(")") + 2 :].split()


def _stat_times(path: str) -> tuple[float, float]:
    """(utime, stime) in seconds from a `/proc/.../stat` file; zeros if it is gone."""
    fields = _stat_fields(path)
    if fields is None:
        return 0.0, 0.0
    return int(fields[11]) / _TICK, int(fields[12]) / _TICK


def group_cpu(pgids: Collection[int]) -> float:
    """utime + stime (seconds) of every live process whose process group is in `pgids`.

    A process that exits between two readings takes its CPU with it (its
    parent's `cutime` is not counted): nothing in a running server should."""
    wanted = set(pgids)
    total = 0.0
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := _stat_fields(f"/proc/{name}/stat")) and int(fields[2]) in wanted:
            total += (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
    return total


def _stat_cpu(path: str) -> float:
    """utime + stime (seconds) from a `/proc/.../stat` file; 0 if it is gone."""
    return sum(_stat_times(path))


@dataclass(frozen=True)
class Snapshot:
    loop: float
    loop_kernel: float
    api: float
    workers: dict[int, float]
    engine: dict[int, float]
    engine_core: dict[int, float]
    #: API server processes seen (`--api-server-count`).
    api_servers: int = 1


def snapshot(api_pid: int) -> Snapshot:
    """The server started as `api_pid`: one API server, or the parent of `--api-server-count` ones."""
    workers: dict[int, float] = {}
    engine: dict[int, float] = {}
    engine_core: dict[int, float] = {}
    api_pids: list[int] = []
    try:
        children = psutil.Process(api_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    for child in children:
        try:
            title = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if title.startswith(API_SERVER_TITLE):
            api_pids.append(child.pid)
            continue
        cpu = _stat_cpu(f"/proc/{child.pid}/stat")
        (workers if title.startswith(WORKER_TITLE) else engine)[child.pid] = cpu
        if title.startswith(ENGINE_CORE_TITLE):
            engine_core[child.pid] = cpu
    if not api_pids:
        api_pids = [api_pid]
    else:
        # The launcher waits on its children: its own CPU is the engine side's.
        engine[api_pid] = _stat_cpu(f"/proc/{api_pid}/stat")
    loops = [_stat_times(f"/proc/{pid}/task/{pid}/stat") for pid in api_pids]
    return Snapshot(
        loop=sum(user + kernel for user, kernel in loops),
        loop_kernel=sum(kernel for _, kernel in loops),
        api=sum(_stat_cpu(f"/proc/{pid}/stat") for pid in api_pids),
        workers=workers,
        engine=engine,
        engine_core=engine_core,
        api_servers=len(api_pids),
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
        "engine_core": _grown(before.engine_core, after.engine_core),
    }
    used["total"] = used["api"] + used["workers"] + used["engine"]
    used["loop_kernel"] = after.loop_kernel - before.loop_kernel
    return used


def new_workers(before: Snapshot, after: Snapshot) -> int:
    """Worker processes that appeared between the snapshots (spawned under load)."""
    return len(set(after.workers) - set(before.workers))


def memory_mib(api_pid: int, kind: Literal["pss", "rss"] = "pss") -> dict[str, float]:
    """Proportional set size (`pss`, MiB: pages shared between processes split
    among them; or the resident set size, `rss`, each process counted whole)
    of the API server process (`api`), of offload's worker processes together
    (`workers`, and how many: `worker_processes`), and of the rest of its tree
    (`engine`); `{}` where `/proc` cannot be read."""
    out = {"api": 0.0, "workers": 0.0, "worker_processes": 0.0, "engine": 0.0}
    try:
        out["api"] = getattr(psutil.Process(api_pid).memory_full_info(), kind) / 2**20
        children = psutil.Process(api_pid).children(recursive=True)
        for child in children:
            used = getattr(child.memory_full_info(), kind) / 2**20
            if " ".join(child.cmdline()).startswith(WORKER_TITLE):
                out["workers"] += used
                out["worker_processes"] += 1
            else:
                out["engine"] += used
    except (psutil.Error, AttributeError):
        return {}
    return out
