"""Overload through the vLLM adapter: `OFFLOAD_VLLM_MAX_QUEUE`, 503 + Retry-After,
`/health` under load, the `offload_*` metrics on vLLM's `/metrics`, and bad request
bodies. A real server per strategy, and one with two API server processes, all
started together; real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.harness.load import HealthProber
from offload._lag import percentile

from ._server import (
    Server,
    api_server_processes,
    good_retry_after,
    load_client,
    scrape,
    servers_started,
    start_server,
    total,
)
from .conftest import AVAILABLE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

QUEUED = tuple(s for s in ("thread", "process", "async-renderer", "ray") if s in AVAILABLE)
MAX_QUEUE = 1
CLIENTS = 64


#: The server of `test_metrics_with_two_api_servers`, started with the others.
TWO_API_SERVERS = "two API servers"


@pytest.fixture(scope="module")
def bounded_servers(
    model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, ray_env: dict[str, str]
) -> Iterator[dict[str, Server]]:
    """One server per queued strategy with `OFFLOAD_VLLM_MAX_QUEUE`, and the
    two-API-server one, started together (a start is mostly one process
    importing: together they take about half the time)."""
    with contextlib.ExitStack() as stack:
        env = {"OFFLOAD_VLLM_MAX_QUEUE": str(MAX_QUEUE)}
        starts: dict[str, Callable[[], Server]] = {
            strategy: functools.partial(
                start_server, model_dirs["embed"], "minilm", strategy, tmp_path_factory.mktemp(f"overload-{strategy}"),
                # One worker: the queue bound is reached at a load the 2-core machine can offer.
                workers=1 if strategy in ("thread", "process", "ray") else None,
                extra_env={**env, **(ray_env if strategy == "ray" else {})},
            )
            for strategy in QUEUED
        }
        if "thread" in AVAILABLE:
            starts[TWO_API_SERVERS] = functools.partial(
                start_server, model_dirs["embed"], "minilm", "thread", tmp_path_factory.mktemp("overload-two-api"),
                workers=1, extra_env={"OFFLOAD_VLLM_MAX_QUEUE": "0"}, extra_args=("--api-server-count", "2"),
            )
        yield stack.enter_context(servers_started(starts))


@pytest.fixture(params=QUEUED)
def bounded_server(request: pytest.FixtureRequest, bounded_servers: dict[str, Server]) -> Server:
    server = bounded_servers[str(request.param)]
    assert server.alive(), server.log_tail()
    return server



async def overload(server: Server, seconds: float) -> tuple[Counter[int | str], list[float], int]:
    """`CLIENTS` closed-loop clients for `seconds`.
    Returns (status counts, with transport errors by name, accepted latencies,
    503s without a good Retry-After header)."""
    statuses: Counter[int | str] = Counter()
    accepted: list[float] = []
    missing_retry_after = 0
    # Short texts: the engine is quick, so the frontend (render, post-process) is
    # what saturates, as with the benchmarks' tiny model.
    text = "offload keeps the loop alive under load"
    stop = time.monotonic() + seconds
    async with load_client(CLIENTS + 4, timeout=120) as client:

        async def worker(i: int) -> None:
            nonlocal missing_retry_after
            j = 0
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                try:
                    r = await client.post(
                        f"{server.url}/v1/embeddings",
                        json={"model": server.model, "input": [f"{i} {j} {k} {text}" for k in range(8)]},
                    )
                except httpx.TransportError as exc:
                    # Counted, and judged by the caller: one run in CI saw one
                    # ReadError among thousands of answers (not seen since).
                    statuses[type(exc).__name__] += 1
                    j += 1
                    continue
                statuses[r.status_code] += 1
                if r.status_code == 200:
                    accepted.append(time.perf_counter() - t0)
                elif r.status_code == 503:
                    if not good_retry_after(r.headers.get("retry-after")):
                        missing_retry_after += 1
                    body = r.json()
                    assert body["error"]["code"] == 503, body
                    assert body["error"]["type"] == "Service Unavailable", body
                    # A polite client backs off (Retry-After says 1 s or more; a
                    # load test keeps the pressure on with a tenth of a second).
                    await asyncio.sleep(0.1)
                j += 1

        # A task group: a client that fails stops the others before the
        # connection pool closes (no socket is left to a later test's gc).
        async with asyncio.TaskGroup() as group:
            for i in range(CLIENTS):
                group.create_task(worker(i))
    return statuses, accepted, missing_retry_after


def test_overload_answers_200_or_503_and_metrics_show_it(bounded_server: Server) -> None:
    server = bounded_server
    strategy = server.log.name.split("-", 1)[1].removesuffix(".log")
    # Warm-up: the first requests start the workers (a process worker builds its
    # renderer) and allocate; a real deployment has done this before load comes.
    for _ in range(3):
        r = httpx.post(f"{server.url}/v1/embeddings", json={"model": server.model, "input": ["warm", "up"]}, timeout=300)
        assert r.status_code == 200, r.text
    before = scrape(server)
    # /health is probed from another process (every 10 ms), so that this process's
    # busy load generator does not inflate the figures.
    with HealthProber(server.url) as prober:
        statuses, accepted, missing = asyncio.run(overload(server, seconds=12))
    health = list(prober.latencies)
    after = scrape(server)
    rejected = total(after, "offload_rejected_calls_total", reason="overloaded") - total(
        before, "offload_rejected_calls_total", reason="overloaded"
    )
    lag_count = total(after, "offload_loop_lag_seconds_count", loop="vllm-api-server")
    lag_sum = total(after, "offload_loop_lag_seconds_sum", loop="vllm-api-server")
    health.sort()
    accepted.sort()
    print(
        f"\n[vllm overload {strategy}] max_queue={MAX_QUEUE} clients={CLIENTS}: "
        f"statuses={dict(statuses)} accepted p50={percentile(accepted, 50) * 1e3:.1f} ms "
        f"p99={percentile(accepted, 99) * 1e3:.1f} ms; /health n={len(health)} "
        f"p50={percentile(health, 50) * 1e3:.1f} ms p99={percentile(health, 99) * 1e3:.1f} ms; "
        f"/metrics: rejected(overloaded)+={rejected:.0f}, loop-lag samples={lag_count:.0f} "
        f"mean={lag_sum / max(lag_count, 1) * 1e3:.2f} ms"
    )
    answered = statuses[200] + statuses[503]
    errors = {k: n for k, n in statuses.items() if k not in (200, 503)}
    assert all(isinstance(k, str) for k in errors), statuses  # every answer is 200 or 503
    # A connection lost now and then on a loaded loopback is tolerated (under
    # 1 in 200 answers, and at most 2); more would be the server dropping them.
    assert sum(errors.values()) <= max(2, answered // 200), statuses
    assert server.alive(), server.log_tail()
    assert statuses[200] > 0
    assert missing == 0
    # Every 503 a client saw is counted on /metrics (a render refused after the
    # entry check counts there too, so >=).
    assert rejected >= statuses[503]
    assert lag_count > 0
    assert len(health) >= 10
    assert prober.failures == 0
    # Target: /health p99 under 20 ms (printed above); the assertion keeps a wide
    # margin for a shared 2-core machine: /health is never starved.
    assert percentile(health, 99) < 5.0, percentile(health, 99)
    # The server keeps serving once the load is gone.
    r = httpx.post(f"{server.url}/v1/embeddings", json={"model": server.model, "input": "still here"}, timeout=60)
    assert r.status_code == 200


def test_metrics_page_lists_every_offload_metric(bounded_server: Server) -> None:
    text = httpx.get(f"{bounded_server.url}/metrics", timeout=30).text
    for name in (
        "offload_queue_wait_seconds",
        "offload_run_seconds",
        "offload_queued_calls",
        "offload_running_calls",
        "offload_loop_lag_seconds",
    ):
        assert f"# TYPE {name} " in text, name


# ---- bad request bodies: 4xx, never 5xx --------------------------------------

_edge_text = st.sampled_from(
    ["", " ", "\x00", "\ud7ff", "\U0010ffff", "e\u0301", "\u202e", "🙂" * 50, "\n\t", "a" * 5000]
)
_token_ids = st.lists(st.integers(min_value=-(2**40), max_value=2**40), max_size=20)
_input = st.one_of(
    st.none(),
    st.integers(),
    st.floats(allow_nan=True),
    st.booleans(),
    st.text(max_size=50),
    _edge_text,
    st.just([]),
    st.just([[]]),
    st.lists(st.one_of(st.text(max_size=10), st.integers(), st.none()), max_size=5),
    _token_ids,
    st.lists(_token_ids, min_size=1, max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.just(["x" * 3000] * 4),
)
_body = st.fixed_dictionaries(
    {"input": _input},
    optional={
        "model": st.one_of(st.just("minilm"), st.text(max_size=10), st.integers()),
        "encoding_format": st.one_of(st.sampled_from(["float", "base64", "bogus"]), st.integers()),
        "dimensions": st.one_of(st.integers(min_value=-5, max_value=10_000), st.text(max_size=3)),
        "truncate_prompt_tokens": st.one_of(st.integers(min_value=-3, max_value=10_000), st.text(max_size=3)),
        "user": st.one_of(st.text(max_size=5), st.integers()),
    },
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=_body)
def test_bad_bodies_get_4xx_never_5xx(bounded_server: Server, body: dict[str, Any]) -> None:
    r = httpx.post(
        f"{bounded_server.url}/v1/embeddings",
        content=json.dumps(body, allow_nan=True),
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 200 or 400 <= r.status_code < 500, (body, r.status_code, r.text[:300])


def test_still_serving_after_bad_bodies(bounded_server: Server) -> None:
    r = httpx.post(
        f"{bounded_server.url}/v1/embeddings", json={"model": bounded_server.model, "input": ["ok", "fine"]}, timeout=60
    )
    assert r.status_code == 200
    assert len(r.json()["data"]) == 2


# ---- several API server processes (Prometheus multiprocess mode) --------------


def test_metrics_with_two_api_servers(bounded_servers: dict[str, Server]) -> None:
    if TWO_API_SERVERS not in bounded_servers:
        pytest.skip("needs the thread strategy")
    server = bounded_servers[TWO_API_SERVERS]
    assert len(api_server_processes(server)) == 2, server.log_tail()
    statuses, _, missing = asyncio.run(overload(server, seconds=5))
    values = scrape(server)
    print(
        f"\n[vllm --api-server-count 2] statuses={dict(statuses)}; /metrics: "
        f"rejected={total(values, 'offload_rejected_calls_total', reason='overloaded'):.0f} "
        f"runs={total(values, 'offload_run_seconds_count'):.0f} "
        f"loop-lag samples={total(values, 'offload_loop_lag_seconds_count', loop='vllm-api-server'):.0f}"
    )
    assert set(statuses) <= {200, 503}, statuses
    assert missing == 0
    assert statuses[200] > 0
    # vLLM collects every API server process's files: ours are among them.
    assert total(values, "offload_run_seconds_count") >= statuses[200]
    assert total(values, "offload_loop_lag_seconds_count", loop="vllm-api-server") > 0
    assert total(values, "offload_rejected_calls_total", reason="overloaded") >= statuses[503]
