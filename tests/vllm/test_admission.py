"""Every pooling request is admitted exactly once, before any work, and refused only
with vLLM's 503: late-interaction scoring, which
`ServingScores.__call__` runs without the base `__call__`; scoring that enters
both; the early refusal behind a proxy's `--root-path`; and what a truncated
text is charged. Real servers on 127.0.0.1, one worker and (but the last)
`OFFLOAD_VLLM_MAX_QUEUE=0`: one request in flight at a time, so a request
that held two places would be refused on its own.

The module's servers start together (with other modules' own, `_module_servers`),
before the session's shared ones (module order); each is idle but for the
test that uses it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import httpx
import pytest
from offload_vllm._admission import REQUEST_LABEL

from ._heavy import heavy_body, in_flight, unbroken_heavy_body
from ._module_servers import ModuleServers, register
from ._server import (
    Server,
    good_retry_after,
    load_client,
    scrape,
    start_server,
    total,
)
from .conftest import AVAILABLE

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(900),
    pytest.mark.skipif("thread" not in AVAILABLE, reason="needs the thread strategy"),
]

# Every call on the worker (`OFFLOAD_VLLM_INLINE_COST=0`): while one request
# waits for its render there, the loop brings others to the entry, where they
# find the one place taken. With the default, these small requests run on the
# loop and a fast machine can serve the flood one at a time, refusing nothing.
# No express worker either: one worker, one call at a time.
ONE_AT_A_TIME = {"OFFLOAD_VLLM_MAX_QUEUE": "0", "OFFLOAD_VLLM_INLINE_COST": "0", "OFFLOAD_VLLM_EXPRESS_COST": "0"}
ROOT_PATH = "/api"
#: The "priced" server's cost bound: above what 64 long truncated texts cost
#: capped (or by their body's bytes), below what they cost whole.
PRICED_BOUND = 500_000
QUERY = "What is the capital of France?"
DOCS = [f"document {i}: Paris is the capital of France, and Berlin is in Germany." for i in range(8)]


@register(__name__, needs=("thread",), servers=4)
def starts(model_dirs: Mapping[str, Path], logs: Path) -> dict[str, Callable[[], Server]]:
    wanted = {
        # Late interaction: vLLM scores with flash_late_interaction (its default).
        "late": (model_dirs["late-interaction"], "tiny-colbert", ONE_AT_A_TIME, ()),
        # ServingScores.__call__ calling PoolingBaseServing.__call__.
        "cross": (model_dirs["cross-encoder"], "tiny-cross-encoder", ONE_AT_A_TIME, ()),
        # The heavy request holds the place for seconds only when its long
        # texts are tokenized whole: prefix tokenization reads a few hundred
        # characters of each, and it could be answered before the first probe.
        "rooted": (model_dirs["embed"], "minilm", {**ONE_AT_A_TIME, "OFFLOAD_VLLM_PREFIX_TOKENIZE": "0"}, ("--root-path", ROOT_PATH)),
        # Prefix tokenization on (the default), a cost bound, lanes' places.
        "priced": (model_dirs["embed"], "minilm", {"OFFLOAD_VLLM_MAX_QUEUED_COST": str(PRICED_BOUND)}, ()),
    }
    return {
        key: functools.partial(
            start_server,
            model,
            name,
            "thread",
            logs,
            workers=1,
            extra_env=env,
            extra_args=args,
        )
        for key, (model, name, env, args) in wanted.items()
    }


@pytest.fixture(scope="module")
def bounded(module_servers: ModuleServers) -> Iterator[dict[str, Server]]:
    with module_servers.taken(__name__) as started:
        yield started


def rejected_elsewhere(server: Server) -> float:
    """Refusals counted under any function but the request's entry: a call refused halfway."""
    values = scrape(server)
    return total(values, "offload_rejected_calls_total", reason="overloaded") - total(
        values, "offload_rejected_calls_total", reason="overloaded", function=REQUEST_LABEL
    )


async def flood(server: Server, requests: list[tuple[str, dict[str, object]]], seconds: float) -> Counter[str]:
    """16 closed-loop clients cycling through `requests` for `seconds`: each answer
    as `status` (a 503 as `503` only with vLLM's body and `Retry-After: 1`)."""
    answers: Counter[str] = Counter()
    stop = time.monotonic() + seconds
    async with load_client(20) as client:

        async def client_loop(i: int) -> None:
            j = i
            while time.monotonic() < stop:
                path, body = requests[j % len(requests)]
                r = await client.post(f"{server.url}{path}", json=body)
                if r.status_code == 503:
                    error = r.json()["error"]
                    ok = good_retry_after(r.headers.get("retry-after")) and error["code"] == 503
                    answers["503" if ok else f"503 without vLLM's body or Retry-After: {r.text[:200]}"] += 1
                    await asyncio.sleep(0.05)
                else:
                    answers[str(r.status_code) if r.status_code == 200 else f"{r.status_code}: {r.text[:200]}"] += 1
                j += 1

        await asyncio.gather(*(client_loop(i) for i in range(16)))
    return answers


def scoring_requests(model: str) -> list[tuple[str, dict[str, object]]]:
    return [
        ("/score", {"model": model, "queries": QUERY, "documents": DOCS}),
        ("/rerank", {"model": model, "query": QUERY, "documents": DOCS}),
        ("/v1/score", {"model": model, "queries": [QUERY] * 2, "documents": DOCS[:2]}),
    ]


@pytest.mark.parametrize("key", ["late", "cross"])
def test_scoring_is_admitted_once_and_refused_only_with_503(bounded: dict[str, Server], key: str) -> None:
    server = bounded[key]
    requests = scoring_requests(server.model)
    # Alone, each is admitted: one request holds one place, however many
    # `__call__`s it enters (a second would find the one place taken).
    for path, body in requests:
        r = httpx.post(f"{server.url}{path}", json=body, timeout=120)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
    before = rejected_elsewhere(server)
    answers = asyncio.run(flood(server, requests, seconds=8))
    print(f"\n[{key}] {dict(answers)}")  # noqa: T201 (the figures of the run)
    assert set(answers) == {"200", "503"}, answers
    # Refused at the entry only: no render or post-processing call was refused.
    assert rejected_elsewhere(server) == before


def test_late_interaction_flood_is_counted_at_the_entry(bounded: dict[str, Server]) -> None:
    server = bounded["late"]
    entry = total(scrape(server), "offload_rejected_calls_total", reason="overloaded", function=REQUEST_LABEL)
    answers = asyncio.run(flood(server, scoring_requests(server.model), seconds=4))
    after = total(scrape(server), "offload_rejected_calls_total", reason="overloaded", function=REQUEST_LABEL)
    assert after - entry >= answers["503"] > 0


# ---- the early refusal behind a proxy (--root-path) ----------------------------------


@pytest.mark.parametrize("path", [f"{ROOT_PATH}/v1/embeddings", "/v1/embeddings"])
def test_behind_a_root_path_a_full_server_refuses_before_reading_the_body(
    bounded: dict[str, Server], path: str
) -> None:
    """While a heavy request holds the one place, a body that is not even JSON
    is answered 503 (the middleware, before reading it), not 400 (FastAPI
    parsing it), at the route with the proxy's prefix and without it."""
    server = bounded["rooted"]
    statuses: Counter[int] = Counter()
    with in_flight(server, f"{ROOT_PATH}/v1/embeddings", heavy_body(server.model)) as heavy:
        while not heavy.done():
            r = httpx.post(f"{server.url}{path}", content=b"{not json", timeout=60)
            statuses[r.status_code] += 1
            if r.status_code == 503:
                assert good_retry_after(r.headers["retry-after"])
                assert r.json()["error"]["code"] == 503
            time.sleep(0.01)
    assert heavy.result().status_code == 200, heavy.result().text[:300]
    print(f"\n[root path {path}] {dict(statuses)}")  # noqa: T201
    assert statuses[503] > 0, statuses
    assert set(statuses) <= {400, 503}, statuses


# ---- what a truncated text is charged -----------------------------------------------


def test_a_truncated_text_tokenized_whole_is_charged_whole(bounded: dict[str, Server]) -> None:
    """Prefix tokenization reads a few hundred characters of a long truncated
    text, and admission charges that much; a text with no whitespace has no
    place to cut and is tokenized whole, and is charged whole. So while 64 of
    them are queued, a small request is refused by a bound that the capped
    price (or the body's bytes) would leave room under."""
    from offload_vllm._cost import body_floor, characters, inputs_cost, truncated_cap

    server = bounded["priced"]
    body = unbroken_heavy_body(server.model)
    texts = body["input"]
    assert isinstance(texts, list)
    # What a text of words as long would be charged.
    capped = sum(characters("word " * (len(text) // 5), truncated_cap(16)) + 128 for text in texts)
    floor = body_floor(len(json.dumps(body).encode()))
    # The premise: charged capped, the request would leave room for a small one.
    assert max(capped, floor) < PRICED_BOUND < inputs_cost(texts)
    statuses: Counter[int] = Counter()
    seen_queued = 0.0
    with in_flight(server, "/v1/embeddings", body) as heavy:
        while not heavy.done():
            seen_queued = max(seen_queued, total(scrape(server), "offload_lane_queued_cost"))
            r = httpx.post(f"{server.url}/v1/embeddings", json={"model": server.model, "input": "small"}, timeout=60)
            statuses[r.status_code] += 1
            time.sleep(0.01)
    assert heavy.result().status_code == 200, heavy.result().text[:300]
    print(f"\n[charged whole] {dict(statuses)}, queued cost seen up to {seen_queued:.0f}")  # noqa: T201
    assert set(statuses) <= {200, 503}, statuses
    assert statuses[503] > 0, statuses
    # Held at its lane's whole share (a cost past the share is held as the share,
    # until it is answered), not at the capped price, which is below the bound.
    assert seen_queued >= PRICED_BOUND
