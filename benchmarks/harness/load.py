"""A `/health` prober in its own process, and latency summaries.

The prober runs in a separate process so that the load generator's own busy
event loop (2 cores, up to 128 clients) does not inflate `/health` latencies,
and in a session of its own, as a kubelet probes from a process of its own:
where Linux groups tasks by session for scheduling (autogroups), it would
otherwise share the load generator's group and its one share of the CPUs.
It still shares the cores: once answered, it may wait for a CPU before it reads
the answer, so it also records when each answer reached its socket (the
kernel's receive timestamp), which that wait does not delay.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import socket
import time
import urllib.parse
from typing import Any

from benchmarks.harness import raw_http
from benchmarks.harness.side_process import SideProcess
from offload._lag import percentile

REQUEST_TIMEOUT_S = 120.0
# 10 ms between probes: fine enough to catch a stall of a few tens of ms, cheap for the server.
PROBE_INTERVAL_S = 0.01
PROBER_START_TIMEOUT_S = 120.0
#: The share of probes with a receive timestamp below which none is reported.
ARRIVALS_NEEDED = 0.95


def summarize_ms(latencies_s: list[float]) -> dict[str, float]:
    ordered = sorted(latencies_s)
    return {
        "count": float(len(ordered)),
        "mean_ms": 1e3 * sum(ordered) / len(ordered) if ordered else 0.0,
        "p50_ms": 1e3 * percentile(ordered, 50),
        "p99_ms": 1e3 * percentile(ordered, 99),
        "max_ms": 1e3 * (ordered[-1] if ordered else 0.0),
    }


def autogroup(pid: int | str = "self") -> str | None:
    """The scheduling group (Linux autogroup, one per session) that process
    `pid` is in, such as `/autogroup-2207`; None where there is none to read
    (no such process, not Linux, a kernel without autogroups). Whether the
    kernel schedules by them is `/proc/sys/kernel/sched_autogroup_enabled`."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            return f.read().split()[0]
    except (OSError, IndexError):
        return None


def _probe(url: str, ready: Any, stop: Any, conn_out: multiprocessing.connection.Connection) -> None:
    # A session of its own, so a scheduling group of its own (autogroups), as
    # a kubelet's: in the benchmark's, the prober would wait for a CPU behind
    # the load generator's clients, whose wait is not the server's.
    os.setsid()
    # Out of the benchmark's session, a Ctrl-C at its terminal no longer
    # reaches the prober: it stops by itself once the benchmark is gone.
    parent = os.getppid()
    request = raw_http.request_bytes("GET", urllib.parse.urljoin(url, "/health"))
    latencies: list[float] = []
    # Each probe's time until its answer had arrived (the kernel's receive
    # timestamp): the server's time and the network's, without the time this
    # process then waited for a CPU to read it, which on a machine shared with
    # the server and the load is part of the latency.
    arrivals: list[float | None] = []
    failures = 0
    sock: socket.socket | None = None
    while not stop.is_set() and os.getppid() == parent:
        try:
            if sock is None:
                sock = raw_http.connect(url, timeout=30)
            start = time.perf_counter()
            answer, sent = raw_http.exchange(sock, request)  # sent after start: arrived <= latency
            latencies.append(time.perf_counter() - start)
            arrivals.append(None if answer.arrived is None else max(0.0, answer.arrived - sent))
            ready.set()
            if answer.closes:  # the health port's answers say so: the next probe connects anew
                sock.close()
                sock = None
        except (OSError, ValueError):
            failures += 1
            if sock is not None:
                sock.close()
            sock = None
        time.sleep(PROBE_INTERVAL_S)
    if sock is not None:
        sock.close()
    with contextlib.suppress(OSError):  # the benchmark is gone: nobody to tell
        conn_out.send((latencies, failures, arrivals))
    conn_out.close()


class HealthProber(SideProcess):
    """Probe `GET /health` back to back (one connection) while the `with` block runs."""

    def __init__(self, url: str) -> None:
        # Load starts only once the prober has an answer, so every level is probed from its start.
        super().__init__(_probe, (url,), what="the /health prober (no answer)",
                         start_timeout=PROBER_START_TIMEOUT_S, result_timeout=60)

    @property
    def latencies(self) -> list[float]:
        return list(self.result[0]) if self.result else []

    @property
    def failures(self) -> int:
        return int(self.result[1]) if self.result else 0

    @property
    def arrivals(self) -> list[float | None]:
        """Each probe's time (s) until its answer reached the prober's socket, in
        `latencies`' order (None: the kernel gave no timestamp)."""
        return list(self.result[2]) if self.result and len(self.result) > 2 else []

    def summary(self) -> dict[str, float]:
        # Arrivals reported where nearly every probe has one: a few early probes may not.
        return {
            **summarize_ms(self.latencies), "failures": float(self.failures),
            **arrived_ms(self.arrivals, len(self.latencies)),
        }


def arrived_ms(arrivals_s: list[float | None], answers: int) -> dict[str, float]:
    """p50, p99 and max (ms, keys `..._arrived_ms`) of the times until each answer
    arrived (`raw_http`), and how many `answers` had none (`without_arrival`);
    nothing where fewer than `ARRIVALS_NEEDED` of them have one."""
    arrived = [a for a in arrivals_s if a is not None]
    if not arrived or len(arrived) < ARRIVALS_NEEDED * answers:
        return {}
    summary = summarize_ms(arrived)
    return {**{f"{q}_arrived_ms": summary[f"{q}_ms"] for q in ("p50", "p99", "max")},
            "without_arrival": float(answers - len(arrived))}
