"""Costs, flows and lanes through real servers: a small request
served ahead of a heavy one's pieces (and not under `--offload-scheduling fifo`),
the cost bound's 503 before any work, lanes by route and by header with their
metrics on `/metrics`, and engine priorities as vLLM's scheduler receives them.

One worker each, so that pieces queue. The module's servers start together,
before the session's shared ones (module order).
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import pytest
from offload_vllm._admission import engine_priority
from offload_vllm._retry_after import RETRY_AFTER_CAP_S
from offload_vllm._seams import requests as requests_seam
from offload_vllm._seams.requests import request_cost

from ._heavy import heavy_body, in_flight
from ._server import Server, scrape, servers_started, start_server, total
from .conftest import AVAILABLE

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(900),
    pytest.mark.skipif("thread" not in AVAILABLE, reason="needs the thread strategy"),
]

#: The engine seam of `engine_probe/sitecustomize.py`.
ENGINE_PROBE = Path(__file__).parent / "engine_probe"
LANES = {"query": 4.0, "ingest": 1.0}
MAX_QUEUED_COST = 4000
#: The on-loop server's bound: about 20 small requests' costs, fewer than it is sent at once.
ON_LOOP_MAX_QUEUED_COST = 3000


@pytest.fixture(scope="module")
def engine_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine") / "requests.log"


@pytest.fixture(scope="module")
def servers_by_role(
    model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, engine_log: Path
) -> Iterator[dict[str, Server]]:
    probe_env = {
        "OFFLOAD_TEST_ENGINE_LOG": str(engine_log),
        "PYTHONPATH": os.pathsep.join(p for p in (str(ENGINE_PROBE), os.environ.get("PYTHONPATH", "")) if p),
    }
    wanted: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {
        # The launcher's flags, as a deployment would give them.
        "lanes": (
            probe_env,
            (
                "--offload-lanes", ",".join(f"{lane}={weight:g}" for lane, weight in LANES.items()),
                "--offload-lane-routes", "/v1/embeddings=query,/pooling=ingest",
                "--offload-engine-priority", "--scheduling-policy", "priority",
            ),
        ),
        "fifo": ({}, ("--offload-scheduling", "fifo")),
        # The environment variable, as the other way to set it.
        "cost-bound": ({"OFFLOAD_VLLM_MAX_QUEUED_COST": str(MAX_QUEUED_COST)}, ()),
        # Small requests rendered on the loop (the default inline cost), then held by a busy engine.
        "on-loop": (
            {
                "OFFLOAD_VLLM_MAX_QUEUED_COST": str(ON_LOOP_MAX_QUEUED_COST),
                "OFFLOAD_VLLM_INLINE_COST": "1024",
                "OFFLOAD_TEST_ENGINE_DELAY": "0.1",
                "PYTHONPATH": probe_env["PYTHONPATH"],
            },
            (),
        ),
    }
    # The heavy request is long texts cut to 16 tokens, seconds of work only when
    # tokenized whole; and the expected priorities are priced as whole texts.
    # Every call on the executor: the lane tests read lanes from its call
    # metrics, and a one-word request's calls would otherwise run on the loop.
    # And every call on the one worker (no express worker): the order the
    # tests read is the queue's.
    whole = {"OFFLOAD_VLLM_PREFIX_TOKENIZE": "0", "OFFLOAD_VLLM_INLINE_COST": "0", "OFFLOAD_VLLM_EXPRESS_COST": "0"}
    starts = {
        # Each in a folder of its own: the log is named after the model and strategy.
        role: functools.partial(
            start_server, model_dirs["embed"], "minilm", "thread", tmp_path_factory.mktemp(f"lanes-{role}"),
            workers=1, extra_env={**whole, **env}, extra_args=args,
        )
        for role, (env, args) in wanted.items()
    }
    with servers_started(starts) as started:
        yield started


def queued_cost(server: Server) -> float:
    return total(scrape(server), "offload_lane_queued_cost")


def embed(server: Server, path: str = "/v1/embeddings", **body: Any) -> httpx.Response:
    headers = body.pop("headers", None)
    return httpx.post(f"{server.url}{path}", json={"model": server.model, **body}, headers=headers, timeout=300)


# ---- a small request and a heavy one's pieces ------------------------------------


#: Trials before a probe that never came early enough fails the test.
TRIALS = 3


@pytest.mark.parametrize(("role", "served_ahead"), [("lanes", True), ("fifo", False)])
def test_a_small_request_goes_ahead_of_a_heavy_ones_pieces(
    servers_by_role: dict[str, Server], role: str, served_ahead: bool
) -> None:
    """Fair scheduling: the small request's calls go between the heavy request's
    pieces, so it is answered in a small part of the time the heavy one still
    takes; FIFO: it waits for all of them. Shares, not timings, with wide margins.

    The small request must be sent while most of the heavy one's pieces are
    still queued: a probe that only sees them late (the metrics page answers
    slowly on a busy machine) would send it when the heavy request is in the
    engine, where neither scheduler is in play. Such a trial says nothing either
    way and is run again."""
    server = servers_by_role[role]
    assert embed(server, input="warm up").status_code == 200
    heavy_cost = request_cost_of(heavy_body(server.model))
    late_trials = 0
    while (trial := small_beside_heavy(server, heavy_cost)) is None:
        late_trials += 1
        if late_trials == TRIALS:
            pytest.fail(f"in {TRIALS} trials the small request could not be sent while half the heavy one was queued")
    small_latency, heavy_remaining, queued_when_sent = trial
    share = small_latency / heavy_remaining
    print(  # noqa: T201
        f"\n[{role}] small {small_latency * 1e3:.0f} ms = {share:.2f} of the heavy request's remaining time"
        f" (sent with {queued_when_sent / heavy_cost:.0%} of its cost queued; {late_trials} late trials before)"
    )
    if served_ahead:
        assert share < 0.5, (share, queued_when_sent / heavy_cost)
    else:
        assert share > 0.5, (share, queued_when_sent / heavy_cost)


def small_beside_heavy(server: Server, heavy_cost: float) -> tuple[float, float, float] | None:
    """A small request sent while a heavy one renders: the small one's latency,
    the heavy one's time left when the small one was sent, and the cost queued
    then; None if the queue was not seen holding half the heavy cost (too late)."""
    finished: dict[str, float] = {}

    def heavy() -> httpx.Response:
        r = embed(server, **heavy_body(server.model))
        finished["heavy"] = time.perf_counter()
        return r

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        heavy_done = pool.submit(heavy)
        # The heavy request is admitted, its cost queued: its rendering has begun.
        deadline = time.monotonic() + 60
        queued = 0.0
        while queued <= 0 and not heavy_done.done() and time.monotonic() < deadline:
            time.sleep(0.01)
            queued = queued_cost(server)
        if queued < heavy_cost / 2:
            assert heavy_done.result().status_code == 200
            return None
        sent = time.perf_counter()
        small = embed(server, input="a small request")
        small_latency = time.perf_counter() - sent
        assert heavy_done.result().status_code == 200
    assert small.status_code == 200
    return small_latency, finished["heavy"] - sent, queued


# ---- the cost bound ------------------------------------------------------------------


def test_cost_bound_answers_503_before_any_work(servers_by_role: dict[str, Server]) -> None:
    """A request costlier than the bound runs when nothing is queued; while its
    pieces are queued, new requests are answered 503 with `Retry-After`, before
    their body is read (a body that is not even JSON gets 503, not 400); once
    its cost has drained, they run again."""
    server = servers_by_role["cost-bound"]
    heavy = heavy_body(server.model)
    assert request_cost_of(heavy) > MAX_QUEUED_COST
    before = total(scrape(server), "offload_lane_rejected_total", lane="default", reason="overloaded")
    statuses: dict[str, Counter[int]] = {"not json": Counter(), "small": Counter()}
    with in_flight(server, "/v1/embeddings", heavy) as heavy_done:
        while not heavy_done.done():
            for kind, response in (
                ("not json", httpx.post(f"{server.url}/v1/embeddings", content=b"{not json", timeout=60)),
                ("small", embed(server, input="small")),
            ):
                statuses[kind][response.status_code] += 1
                if response.status_code == 503:
                    assert 1 <= int(response.headers["retry-after"]) <= RETRY_AFTER_CAP_S
                    assert response.json()["error"]["code"] == 503
            time.sleep(0.01)
        assert heavy_done.result().status_code == 200
    print(f"\n[cost bound {MAX_QUEUED_COST}] {statuses}")  # noqa: T201
    # Refused while the heavy request's cost was queued, run before and after it.
    assert set(statuses["not json"]) <= {400, 503}, statuses
    assert set(statuses["small"]) <= {200, 503}, statuses
    assert statuses["not json"][503] > 0, statuses
    assert statuses["small"][503] > 0, statuses
    after = total(scrape(server), "offload_lane_rejected_total", lane="default", reason="overloaded")
    assert after - before == statuses["not json"][503] + statuses["small"][503]
    # Every cost admitted was given back: nothing stays queued, and requests run again.
    assert queued_cost(server) == 0
    assert embed(server, input="small").status_code == 200


def test_requests_rendered_on_the_loop_hold_their_cost_until_answered(
    servers_by_role: dict[str, Server],
) -> None:
    """Small requests render on the event loop (priced under the inline cost,
    so no executor call takes their cost over) and then wait for a busy
    engine. Each one holds its cost until it is answered, not only until its
    render ends: 30 sent at once, together priced well past the bound, are
    answered 200 as far as the bound goes and refused 503 with a
    `Retry-After` past it; the held cost and requests return to 0 once the
    last is answered."""
    server = servers_by_role["on-loop"]
    body = {"model": server.model, "input": "a small request, rendered on the event loop"}
    cost = request_cost_of(body)
    count = 30
    assert cost <= 1024, cost
    assert count * cost > 1.4 * ON_LOOP_MAX_QUEUED_COST, cost
    assert embed(server, input="warm up").status_code == 200
    before = scrape(server)
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        responses = list(pool.map(lambda _: embed(server, **body), range(count)))
    after = scrape(server)
    statuses = Counter(response.status_code for response in responses)
    print(f"\n[on the loop, bound {ON_LOOP_MAX_QUEUED_COST}, {count} x cost {cost:g}] {statuses}")  # noqa: T201
    assert set(statuses) <= {200, 503}, statuses
    # Those the bound holds at once are never refused: at least that many are answered.
    assert statuses[200] >= ON_LOOP_MAX_QUEUED_COST // cost, statuses
    for response in responses:
        if response.status_code == 503:
            assert int(response.headers["Retry-After"]) >= 1, response.headers
    rendered_on_loop = total(after, "offload_vllm_loop_calls_total", call="render") - total(
        before, "offload_vllm_loop_calls_total", call="render"
    )
    assert rendered_on_loop >= statuses[200], rendered_on_loop  # the path under test
    assert queued_cost(server) == 0
    assert total(scrape(server), "offload_vllm_admitted_requests") == 0


def request_cost_of(body: dict[str, Any]) -> float:
    from vllm.entrypoints.pooling.embed.protocol import EmbeddingCompletionRequest

    return request_cost(EmbeddingCompletionRequest(**body))


# ---- lanes ------------------------------------------------------------------------------


def test_lanes_by_route_and_by_header_on_the_metrics_page(servers_by_role: dict[str, Server]) -> None:
    server = servers_by_role["lanes"]

    def waits() -> dict[str, float]:
        values = scrape(server)
        return {lane: total(values, "offload_lane_queue_wait_seconds_count", lane=lane) for lane in (*LANES, "default")}

    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("query", "/v1/embeddings", {"input": "by route"}),
        ("ingest", "/pooling", {"input": "by route"}),
        ("ingest", "/v1/embeddings", {"input": "by header", "headers": {"X-Offload-Lane": "ingest"}}),
        ("default", "/v2/embed", {"texts": ["no route, no header"]}),
    ]
    for lane, path, body in cases:
        before = waits()
        r = embed(server, path, **body)
        assert r.status_code == 200, r.text[:300]
        after = waits()
        grown = {name for name in after if after[name] > before[name]}
        assert grown == {lane}, (path, body, before, after)
    # Every lane's series, under vLLM's /metrics.
    families = {
        (name, dict(labels).get("lane"))
        for name, labels in scrape(server)
        if name.startswith("offload_lane_") and dict(labels).get("strategy") == "thread"
    }
    for family in ("offload_lane_queued_cost", "offload_lane_queue_wait_seconds_count", "offload_lane_rejected_total"):
        assert {(family, lane) for lane in (*LANES, "default")} <= families, family


def test_a_header_naming_no_lane_is_a_400(servers_by_role: dict[str, Server]) -> None:
    r = embed(servers_by_role["lanes"], input="x", headers={"X-Offload-Lane": "bulk"})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "X-Offload-Lane: 'bulk' is not a lane this server takes from the header"


# ---- engine priority ---------------------------------------------------------------------


def test_engine_priority_reaches_vllms_scheduler(servers_by_role: dict[str, Server], engine_log: Path) -> None:
    """Each request's prompts reach vLLM's scheduler (`Scheduler.add_request`,
    recorded by the engine probe) with the priority of their cost and lane; a
    request that sets its own keeps it."""
    from vllm.entrypoints.pooling.embed.protocol import EmbeddingCompletionRequest

    server = servers_by_role["lanes"]
    long_text = "offload keeps the event loop alive " * 30
    cases = {
        "small-query": ("/v1/embeddings", {"input": "hi"}, LANES["query"], None),
        "small-ingest": ("/v1/embeddings", {"input": "hi", "headers": {"X-Offload-Lane": "ingest"}}, LANES["ingest"], None),
        "long-query": ("/v1/embeddings", {"input": [long_text] * 4, "truncate_prompt_tokens": 16}, LANES["query"], None),
        "own-priority": ("/v1/embeddings", {"input": "hi", "priority": -3}, LANES["query"], -3),
    }
    expected: dict[str, int] = {}
    for name, (path, body, weight, own) in cases.items():
        r = embed(server, path, request_id=name, **body)
        assert r.status_code == 200, r.text[:300]
        fields = {k: v for k, v in body.items() if k != "headers"}
        # Priced as the server prices it, prefix tokenization off, whatever an
        # earlier test installed in this process.
        with mock.patch.object(requests_seam, "prefix_installed", return_value=False):
            cost = request_cost(EmbeddingCompletionRequest(model=server.model, **fields))
        expected[name] = own if own is not None else engine_priority(cost, weight)
    seen: dict[str, set[int]] = {}
    for line in engine_log.read_text().splitlines():
        request_id, priority = line.rsplit(" ", 1)
        for name in cases:
            if f"-{name}-" in request_id:
                seen.setdefault(name, set()).add(int(priority))
    assert seen == {name: {value} for name, value in expected.items()}
    # Small before large, and the favoured lane before the other.
    assert expected["own-priority"] < expected["small-query"] < expected["small-ingest"] < expected["long-query"]
