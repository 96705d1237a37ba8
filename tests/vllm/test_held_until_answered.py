"""An admitted request holds its place, cost and engine requests until it is
answered (`_admission.HoldUntilAnswered`, `EngineRequests`), on a real server:
under a flood, the requests admitted and not answered never pass the bounds,
no admitted request waits past the latency the bounds state, the refusals
past vLLM's `--max-num-queued-reqs` are the door's (503 and a computed
`Retry-After`, before the body is read), never vLLM's after rendering, and a
client that leaves gives back what its request held."""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from benchmarks.harness.workloads import long_texts

from ._server import (
    Server,
    good_retry_after,
    load_client,
    scrape,
    servers_started,
    start_server,
    total,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

#: vLLM's `--max-num-queued-reqs`: three requests of `TEXTS` texts.
MAX_NUM_QUEUED_REQS = 24
TEXTS = 8
#: Five requests' worth of characters (about 8,000 each): the engine bound binds first.
MAX_QUEUED_COST = 40_000
CLIENTS = 24
FLOOD_S = 10.0
#: vLLM's refusals past its queue limits (`vllm/v1/metrics/loggers.py`).
VLLM_REFUSALS = "vllm:admission_rejections_total"


@pytest.fixture(scope="module")
def server(model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    start = functools.partial(
        start_server, model_dirs["embed"], "minilm", "thread", tmp_path_factory.mktemp("held"), workers=1,
        extra_env={"OFFLOAD_VLLM_MAX_QUEUED_COST": str(MAX_QUEUED_COST)},
        extra_args=("--max-num-queued-reqs", str(MAX_NUM_QUEUED_REQS)),
    )
    with servers_started({"held": start}) as started:
        yield started["held"]


def held(server: Server) -> tuple[float, float]:
    """(requests, engine requests) admitted and not answered, by the adapter's gauges."""
    values = scrape(server)
    return total(values, "offload_vllm_admitted_requests"), total(values, "offload_vllm_admitted_engine_requests")


def bodies(model: str) -> list[dict[str, object]]:
    # About 1,000 characters a text: within the test servers' 256 tokens, so nothing is truncated.
    return [{"model": model, "input": long_texts(TEXTS, words=180, seed=s)} for s in range(6)]


async def flood(server: Server) -> tuple[Counter[int | str], list[float], list[tuple[float, float]], int]:
    """`CLIENTS` closed-loop clients for `FLOOD_S`, each back 0.2 s after a 503
    (sooner than told: pressure, not politeness); the gauges are read every
    50 ms meanwhile. Returns (statuses, admitted latencies, gauge readings,
    503s without a good `Retry-After`)."""
    statuses: Counter[int | str] = Counter()
    latencies: list[float] = []
    readings: list[tuple[float, float]] = []
    bad_retry_after = 0
    payloads = bodies(server.model)
    stop = time.monotonic() + FLOOD_S
    async with load_client(CLIENTS + 2, timeout=120) as client:

        async def one(i: int) -> None:
            nonlocal bad_retry_after
            j = i
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                try:
                    r = await client.post(f"{server.url}/v1/embeddings", json=payloads[j % len(payloads)])
                except httpx.TransportError as exc:
                    statuses[type(exc).__name__] += 1
                    continue
                statuses[r.status_code] += 1
                j += 1
                if r.status_code == 200:
                    latencies.append(time.perf_counter() - t0)
                elif r.status_code == 503:
                    bad_retry_after += not good_retry_after(r.headers.get("retry-after"))
                    await asyncio.sleep(0.2)

        async def watch() -> None:
            while time.monotonic() < stop:
                readings.append(await asyncio.to_thread(held, server))
                await asyncio.sleep(0.05)

        await asyncio.gather(watch(), *(one(i) for i in range(CLIENTS)))
    return statuses, latencies, readings, bad_retry_after


def test_a_flood_is_held_to_the_bounds_and_answered_within_their_latency(server: Server) -> None:
    """The stated latency (docs/operations.md, "What the bounds hold"): an
    admitted request waits behind at most what the bounds hold, so it is
    answered within (the requests the bounds hold + itself) ÷ the requests
    answered per second. Measured here against the same run's rate: the
    median within 2 times it (the engine's batching), the slowest within 4;
    an unbounded backlog (all 24 clients' requests waiting) would be 6 times
    the bound's 4."""
    vllm_refused = total(scrape(server), VLLM_REFUSALS)
    statuses, latencies, readings, bad_retry_after = asyncio.run(flood(server))
    assert set(statuses) <= {200, 503}, statuses
    assert statuses[503] > 0, f"the flood never filled the bounds: {statuses}"
    assert bad_retry_after == 0
    # The refusals past --max-num-queued-reqs were all the adapter's, before rendering.
    assert total(scrape(server), VLLM_REFUSALS) == vllm_refused
    assert readings
    assert max(engine for _, engine in readings) <= MAX_NUM_QUEUED_REQS
    held_requests = min(MAX_NUM_QUEUED_REQS // TEXTS, math.floor(MAX_QUEUED_COST / (TEXTS * 1000)))
    assert max(requests for requests, _ in readings) <= held_requests
    rate = len(latencies) / FLOOD_S
    stated = (held_requests + 1) / rate
    p50 = sorted(latencies)[len(latencies) // 2]
    said = f"p50 {p50:.2f}s max {max(latencies):.2f}s, stated {stated:.2f}s at {rate:.1f} requests/s"
    assert p50 <= 2 * stated, said
    # The slowest may have waited through a stretch where the shared machine answered slower
    # than the flood's mean rate (seen: 2.5x, beside the ray suite): 4x, still short of a backlog's 6x.
    assert max(latencies) <= 4 * stated, said
    deadline = time.monotonic() + 30
    while held(server) != (0.0, 0.0) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert held(server) == (0.0, 0.0)


def test_a_refused_request_is_answered_503_before_its_body_is_read(server: Server) -> None:
    """While the bounds are full, a body that is not even JSON gets the door's
    503 and `Retry-After` (read, it would be vLLM's 400)."""

    async def probe() -> list[httpx.Response]:
        answers: list[httpx.Response] = []
        stop = time.monotonic() + FLOOD_S
        payloads = bodies(server.model)
        async with load_client(CLIENTS + 2, timeout=120) as client:

            async def load(i: int) -> None:
                while time.monotonic() < stop:
                    await client.post(f"{server.url}/v1/embeddings", json=payloads[i % len(payloads)])

            async def unreadable() -> None:
                while time.monotonic() < stop and not any(a.status_code == 503 for a in answers):
                    answers.append(await client.post(f"{server.url}/v1/embeddings", content=b"{not json"))
                    await asyncio.sleep(0.05)

            await asyncio.gather(unreadable(), *(load(i) for i in range(CLIENTS)))
        return answers

    answers = asyncio.run(probe())
    refused = [a for a in answers if a.status_code == 503]
    assert refused, Counter(a.status_code for a in answers)
    assert good_retry_after(refused[0].headers.get("retry-after"))
    assert {a.status_code for a in answers} <= {400, 503}


def test_a_client_that_leaves_mid_request_gives_back_what_it_held(server: Server) -> None:
    """A request of many texts, its client gone after 0.2 s: once vLLM has
    cancelled its handler, nothing it was admitted with is held."""
    payload = {"model": server.model, "input": long_texts(MAX_NUM_QUEUED_REQS, words=180, seed=99)}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{server.url}/v1/embeddings", json=payload, timeout=0.2)
    deadline = time.monotonic() + 30
    while held(server) != (0.0, 0.0) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert held(server) == (0.0, 0.0)
    assert httpx.post(f"{server.url}/v1/embeddings", json=payload, timeout=120).status_code == 200
