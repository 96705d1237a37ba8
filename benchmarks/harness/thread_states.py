"""What one thread of a server spends its time on, read from `/proc` by a sampler process.

A Python server's event-loop thread, while its requests wait, is in one of
three places: running Python (on a CPU, or runnable and waiting for one),
waiting for a lock (in CPython, the GIL: a thread that wants it sleeps in
`futex`), or idle in its selector (`epoll_wait`). Wall-clock latencies
cannot tell these apart; the kernel can:

- `/proc/PID/task/TID/schedstat`: nanoseconds on a CPU, and nanoseconds
  runnable but waiting for one (the run queue), summed by the kernel;
- `/proc/PID/task/TID/stat` (state) and `wchan` (where a sleeping thread
  sleeps), sampled every `INTERVAL_S`: `futex` is a lock (the GIL, or another
  lock: the report says "lock"), a poll or epoll wait is the selector, anything
  else is "other".

The sampler runs in a process of its own, so that it takes neither the GIL
of the process it measures nor that of the client timing the requests.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import time
from collections import Counter
from typing import Any

from benchmarks.harness.side_process import SideProcess

#: 2 ms between samples: 500 a second, each two small reads (~20 µs of CPU).
INTERVAL_S = 0.002
START_TIMEOUT_S = 60.0
STATES = ("running", "lock", "idle", "other")


def classify(stat: str, wchan: str) -> str:
    """One sample: `stat` is the thread's `/proc/.../stat` line, `wchan` its `wchan`."""
    state = stat.rsplit(")", 1)[1].split()[0]
    if state == "R":
        return "running"
    if "futex" in wchan:
        return "lock"
    if "poll" in wchan or "select" in wchan:  # ep_poll, do_epoll_wait, poll_schedule_timeout, do_select
        return "idle"
    return "other"


def read_schedstat(path: str) -> tuple[int, int]:
    """(ns on a CPU, ns runnable waiting for one) of a thread so far."""
    with open(path) as f:
        on_cpu, waiting, _ = f.read().split()
    return int(on_cpu), int(waiting)


def own_wait_s() -> float | None:
    """Seconds the calling thread has spent runnable but waiting for a CPU so
    far (None where the kernel keeps no schedstat). A client that times a
    request reads it before and after: on a machine it shares with the server,
    what it waited for a CPU in between is its own delay, not the server's."""
    try:
        return read_schedstat("/proc/thread-self/schedstat")[1] / 1e9
    except (OSError, ValueError):
        return None


def _sample(task: str, ready: Any, stop: Any, out: multiprocessing.connection.Connection) -> None:
    counts: Counter[str] = Counter()
    try:
        start_stat, started = read_schedstat(f"{task}/schedstat"), time.monotonic()
        ready.set()
        while not stop.is_set():
            with open(f"{task}/stat") as f:
                stat = f.read()
            with open(f"{task}/wchan") as f:
                wchan = f.read()
            counts[classify(stat, wchan)] += 1
            time.sleep(INTERVAL_S)
        end_stat, ended = read_schedstat(f"{task}/schedstat"), time.monotonic()
    except OSError as exc:  # the thread or its process has gone
        ready.set()
        out.send({"error": f"{type(exc).__name__}: {exc}"})
        out.close()
        return
    seconds = ended - started
    out.send({
        "seconds": seconds,
        "samples": dict(counts),
        "cpu_s_per_s": (end_stat[0] - start_stat[0]) / 1e9 / seconds,
        "runqueue_s_per_s": (end_stat[1] - start_stat[1]) / 1e9 / seconds,
    })
    out.close()


class ThreadStates(SideProcess):
    """Sample thread `tid` of process `pid` (its main thread by default) while
    the `with` block runs; `summary()` gives what it spent its time on."""

    def __init__(self, pid: int, tid: int | None = None) -> None:
        task = f"/proc/{pid}/task/{pid if tid is None else tid}"
        super().__init__(_sample, (task,), what="the thread-state sampler",
                         start_timeout=START_TIMEOUT_S, result_timeout=30)

    def summary(self) -> dict[str, Any]:
        """Shares of the samples in each of `STATES` (they sum to 1), CPU seconds
        and run-queue seconds per second, or `{"error": ...}`."""
        result = self.result or {"error": "not sampled"}
        if "error" in result:
            return dict(result)
        counts = result["samples"]
        total = sum(counts.values()) or 1
        return {
            **{state: counts.get(state, 0) / total for state in STATES},
            "samples": total,
            "cpu_s_per_s": result["cpu_s_per_s"],
            "runqueue_s_per_s": result["runqueue_s_per_s"],
        }
