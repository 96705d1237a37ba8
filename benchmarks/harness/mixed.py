"""Mixed traffic: small requests timed here while a flood of heavy ones runs in another process.

    small requests (this process)   ----\\
    heavy clients (flood process)   -----+--> one vLLM server
    GET /health (prober process)    ----/

Small requests are sent open-loop on plain sockets (`open_loop_timed`: at
the times of a schedule, such as `poisson_arrivals`, each on a thread of its
own, whatever the earlier ones' answers); the flood by closed-loop clients
(`closed_loop`: each sends its next request when the last is answered).

The flood has its own process so that the small requests' latencies are timed
on an event loop that is not also pushing the heavy requests' bodies (up to a
few MB each); the `/health` prober has its own for the same reason
(`load.HealthProber`). Every request is tallied by its answer: an HTTP status,
or *lost* (sent, never answered: connection dropped or timed out). The clocks
are `time.monotonic()`, which Linux shares between processes, so the flood's
completions can be counted inside the window the small requests ran in.

Request bodies are JSON bytes built once (`workloads`: the client's own JSON
encoding is not part of the measurement); the flood builds its own in its
process from a picklable factory, so multi-megabyte bodies never cross a pipe.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import multiprocessing
import multiprocessing.connection
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from benchmarks.harness import raw_http
from benchmarks.harness.load import REQUEST_TIMEOUT_S, arrived_ms, summarize_ms
from benchmarks.harness.side_process import SideProcess
from benchmarks.harness.workloads import Bodies

FLOOD_START_TIMEOUT_S = 120.0
#: Open-loop requests in flight at once, at most: far above what a few small
#: requests a second keep in flight (about rate x latency, under 10 here even
#: flooded), so it binds only when the server has all but stopped answering.
MAX_IN_FLIGHT = 256
# The flood's in-flight requests are answered before its results come back:
# at most one request timeout, plus its process's start and exit.
FLOOD_RESULT_TIMEOUT_S = REQUEST_TIMEOUT_S + 60.0
# uvicorn closes idle keep-alive connections after 5 s; a client that reused one
# as it closed would see a dropped connection that says nothing about the
# server's answers (tests/vllm/_server.py), so the client lets them go first.
KEEPALIVE_S = 1.0
_JSON = {"Content-Type": "application/json"}


@dataclass
class Tally:
    """Every request one kind of client sent, by how it ended."""

    sent: int = 0
    #: Open loop: requests due by the schedule and not sent, because
    #: `max_in_flight` requests were already waiting for their answers.
    unsent: int = 0
    #: HTTP status (as a string, so the tally survives JSON) -> answers.
    statuses: Counter[str] = field(default_factory=Counter)
    #: Latency (s) and completion time (`time.monotonic()`) of each 200.
    latencies_s: list[float] = field(default_factory=list)
    finished_at: list[float] = field(default_factory=list)
    first_error: str = ""
    #: Plain-socket clients (`open_loop_timed`): each 200's time (s) from
    #: sending until its answer reached the client's socket, by the kernel's
    #: clock (`raw_http`), in `latencies_s`' order; None where the kernel gave
    #: no stamp. Empty for aiohttp's clients, which cannot read it.
    arrivals_s: list[float | None] = field(default_factory=list)

    @property
    def answered(self) -> int:
        return sum(self.statuses.values())

    @property
    def lost(self) -> int:
        return self.sent - self.answered

    def summary(self, window: tuple[float, float]) -> dict[str, Any]:
        """Counts, latency percentiles of the 200s, and the 200s a second that
        completed inside `window` (monotonic start, end)."""
        ok = summarize_ms(self.latencies_s)
        begin, end = window
        done = sum(begin <= t <= end for t in self.finished_at)
        return {
            "sent": self.sent,
            "unsent": self.unsent,
            "statuses": dict(self.statuses),
            "lost": self.lost,
            "ok": len(self.latencies_s),
            "p50_ms": ok["p50_ms"],
            "p99_ms": ok["p99_ms"],
            "max_ms": ok["max_ms"],
            "requests_per_s": done / (end - begin) if end > begin else 0.0,
            "first_error": self.first_error,
            **arrived_ms(self.arrivals_s, len(self.latencies_s)),
        }


async def _send(session: Any, url: str, body: bytes, tally: Tally) -> float:
    """POST one request and tally how it ended; the `Retry-After` (s) of a 503, else 0."""
    import aiohttp

    tally.sent += 1
    t0 = time.monotonic()
    try:
        async with session.post(url, data=body, headers=_JSON) as resp:
            await resp.read()
            status, retry_after = resp.status, float(resp.headers.get("Retry-After") or 0)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        if not tally.first_error:
            tally.first_error = f"{type(exc).__name__}: {exc}"
        return 0.0
    done = time.monotonic()
    tally.statuses[str(status)] += 1
    if status == 200:
        tally.latencies_s.append(done - t0)
        tally.finished_at.append(done)
    elif not tally.first_error:
        tally.first_error = f"HTTP {status}"
    return retry_after if status == 503 else 0.0


def _session(connections: int) -> Any:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=connections, keepalive_timeout=KEEPALIVE_S)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S))


async def closed_loop(
    url: str, bodies: list[bytes], clients: int, keep_going: Callable[[], bool], tally: Tally,
    deadline: float = math.inf,
) -> None:
    """`clients` clients, each sending its next request when the last one is
    answered, while `keep_going()`; a client refused with 503 first waits its
    `Retry-After`, as a client that honours it does, never past `deadline` (monotonic).
    Returns once every request sent is answered or lost."""
    async with _session(clients) as session:

        async def client(first: int) -> None:
            n = first
            while keep_going():
                body = bodies[n % len(bodies)]
                n += clients
                pause = await _send(session, url, body, tally)
                if pause > 0:
                    await asyncio.sleep(max(0.0, min(pause, deadline - time.monotonic())))

        await asyncio.gather(*(client(i) for i in range(clients)))


def poisson_arrivals(rate: float, seconds: float, rng: random.Random) -> list[float]:
    """Send times (s from the start, below `seconds`) of a Poisson process of
    `rate` requests a second: exponential gaps of mean `1 / rate`."""
    times: list[float] = []
    t = rng.expovariate(rate)
    while t < seconds:
        times.append(t)
        t += rng.expovariate(rate)
    return times


def open_loop_timed(
    url: str, bodies: list[bytes], arrivals: list[float], tally: Tally, max_in_flight: int = MAX_IN_FLIGHT
) -> None:
    """Send request `n` at `arrivals[n]` s from now on plain sockets
    (`raw_http`), each on a thread of its own, without waiting for earlier
    answers; a request due while `max_in_flight` are in flight is counted in
    `tally.unsent` instead; each 200 also records when its answer reached the client's
    socket (`Tally.arrivals_s`). Idle keep-alive connections are reused,
    newest first, for at most `KEEPALIVE_S`. Returns once every request sent
    is answered or lost (each within `REQUEST_TIMEOUT_S`)."""
    requests = [raw_http.request_bytes("POST", url, body) for body in bodies]
    lock = threading.Lock()  # guards `tally`, `idle` and `in_flight`
    idle: list[tuple[float, socket.socket]] = []
    in_flight = 0

    def connection() -> socket.socket:
        with lock:
            while idle:
                used, sock = idle.pop()
                if time.monotonic() - used < KEEPALIVE_S:
                    return sock
                sock.close()
        return raw_http.connect(url, REQUEST_TIMEOUT_S)

    def send(request: bytes) -> None:
        nonlocal in_flight
        try:
            exchanged(request)
        finally:
            with lock:
                in_flight -= 1

    def exchanged(request: bytes) -> None:
        t0 = time.monotonic()
        sock: socket.socket | None = None
        try:
            sock = connection()
            answer, sent = raw_http.exchange(sock, request)
        except (OSError, ValueError) as exc:
            if sock is not None:
                sock.close()
            with lock:
                tally.first_error = tally.first_error or f"{type(exc).__name__}: {exc}"
            return
        done = time.monotonic()
        with lock:
            if answer.closes:
                sock.close()
            else:
                idle.append((done, sock))
            tally.statuses[str(answer.status)] += 1
            if answer.status != 200:
                tally.first_error = tally.first_error or f"HTTP {answer.status}"
                return
            tally.latencies_s.append(done - t0)
            tally.finished_at.append(done)
            tally.arrivals_s.append(None if answer.arrived is None else max(0.0, answer.arrived - sent))

    with concurrent.futures.ThreadPoolExecutor(max_in_flight) as pool:
        start = time.monotonic()
        for n, at in enumerate(arrivals):
            delay = start + at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            with lock:
                if in_flight >= max_in_flight:
                    tally.unsent += 1
                    continue
                in_flight += 1
                tally.sent += 1
            pool.submit(send, requests[n % len(requests)])
    for _, sock in idle:
        sock.close()


def run_for(url: str, bodies: list[bytes], clients: int, seconds: float) -> Tally:
    """`closed_loop` for `seconds` (the requests in flight then are still waited for)."""
    tally = Tally()
    deadline = time.monotonic() + seconds
    asyncio.run(closed_loop(url, bodies, clients, lambda: time.monotonic() < deadline, tally, deadline))
    return tally


def run_open_timed(url: str, bodies: list[bytes], arrivals: list[float], max_in_flight: int = MAX_IN_FLIGHT) -> Tally:
    """`open_loop_timed` from now until the last arrival (its requests in flight then are still waited for)."""
    tally = Tally()
    open_loop_timed(url, bodies, arrivals, tally, max_in_flight)
    return tally


def _flood(
    url: str, build: Bodies, clients: int, started: Any, stop: Any,
    out: multiprocessing.connection.Connection,
) -> None:
    bodies = build()
    tally = Tally()

    async def go() -> None:
        # Set once the loop runs: the first requests go out in this same turn.
        asyncio.get_running_loop().call_soon(started.set)
        await closed_loop(url, bodies, clients, lambda: not stop.is_set(), tally)

    asyncio.run(go())
    out.send(tally)
    out.close()


class Flood(SideProcess):
    """`build()`'s bodies sent to `url` from another process, from `__enter__`
    until `__exit__`, by `clients` closed-loop clients; `tally` holds what
    they got. `__exit__` raises if their requests were not all answered
    or lost in time (unless the block raised)."""

    def __init__(self, url: str, build: Bodies, clients: int) -> None:
        super().__init__(_flood, (url, build, clients), what="the flood process",
                         start_timeout=FLOOD_START_TIMEOUT_S, result_timeout=FLOOD_RESULT_TIMEOUT_S)

    @property
    def tally(self) -> Tally:
        return self.result if isinstance(self.result, Tally) else Tally()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        super().__exit__(exc_type, exc_val, exc_tb)
        if self.result is None and exc_type is None:
            raise RuntimeError("the flood's requests were not all answered or lost in time")
