"""What a request meets before any work, through one real server: vLLM's
authentication and the operator's middleware before offload's early refusal,
the lanes a header may name (`OFFLOAD_VLLM_LANE_HEADER`), the per-request
cost cap (`OFFLOAD_VLLM_MAX_REQUEST_COST`, HTTP 413), deeply nested bodies
(vLLM's 400, never a 500 or a reset), and an early refusal that never
refuses what admission would admit (CJK, emoji, token ids).

One server for the module (one worker, so a request's rendering holds it),
started before the session's shared ones (module order).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from ._images import forged_png
from ._module_servers import ModuleServers, register
from ._server import Server, scrape, start_server, total
from .conftest import AVAILABLE

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(900),
    pytest.mark.skipif("thread" not in AVAILABLE, reason="needs the thread strategy"),
]

API_KEY = "door-secret"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MAX_QUEUED_COST = 20_000
MAX_REQUEST_COST = 5_000_000
ROOT = Path(__file__).resolve().parents[2]


@register(__name__, needs=("thread",), servers=1)
def starts(model_dirs: Mapping[str, Path], log_dir: Path) -> dict[str, Callable[[], Server]]:
    env = {
        "OFFLOAD_VLLM_LANES": "query=4,bulk=1",
        "OFFLOAD_VLLM_LANE_ROUTES": "/pooling=bulk",
        # `bulk` is reached by route alone; `default` by neither header nor route here.
        "OFFLOAD_VLLM_LANE_HEADER": "query",
        "OFFLOAD_VLLM_MAX_QUEUED_COST": str(MAX_QUEUED_COST),
        "OFFLOAD_VLLM_MAX_REQUEST_COST": str(MAX_REQUEST_COST),
        # The early-refusal test holds the one worker with a long text cut to 16
        # tokens: tokenized whole, it takes seconds; by its prefix, microseconds.
        "OFFLOAD_VLLM_PREFIX_TOKENIZE": "0",
        # Every call on the executor: the tests read lanes from its call metrics,
        # and a one-word request's calls would otherwise run on the loop.
        "OFFLOAD_VLLM_INLINE_COST": "0",
        # And on the one worker (no express worker), which the early-refusal test holds.
        "OFFLOAD_VLLM_EXPRESS_COST": "0",
        # The operator's middleware module, importable in the server.
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
    }
    args = ("--api-key", API_KEY, "--middleware", "tests.vllm.operator_middleware.StripLaneHeader")
    start = lambda: start_server(  # noqa: E731
        model_dirs["embed"], "minilm", "thread", log_dir, workers=1, extra_env=env,
        extra_args=args,
    )
    return {"door": start}


@pytest.fixture(scope="module")
def server(module_servers: ModuleServers) -> Iterator[Server]:
    with module_servers.taken(__name__) as started:
        yield started["door"]


def encoded(server: Server, body: dict[str, Any]) -> bytes:
    """`body` as `json.dumps` writes it (and most clients: Python's `requests`,
    curl with such a file): non-ASCII characters escaped, `\\uXXXX` each."""
    return json.dumps({"model": server.model, **body}).encode()


def post(server: Server, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(
        f"{server.url}{path}", content=encoded(server, body),
        headers={"content-type": "application/json", **(headers or {})}, timeout=300,
    )


def rejected(server: Server) -> float:
    return total(scrape(server), "offload_lane_rejected_total")


def queue_waits(server: Server, lane: str) -> float:
    return total(scrape(server), "offload_lane_queue_wait_seconds_count", lane=lane)


# ---- authentication and the operator's middleware come first ----------------------------


def test_a_request_failing_authentication_gets_vllms_401_and_nothing_from_offload(server: Server) -> None:
    """The early refusal ran outside vLLM's `--api-key` check: an unauthenticated
    client got a 400 listing the lanes for a header naming none."""
    before = rejected(server)
    r = post(server, "/v1/embeddings", {"input": "x"}, {"X-Offload-Lane": "bogus"})
    assert (r.status_code, r.json()) == (401, {"error": "Unauthorized"})
    assert rejected(server) == before


def test_the_operators_middleware_runs_before_the_lane_is_read(server: Server) -> None:
    """An operator's `--middleware` that removes the header: the early refusal
    ran before it and answered 400 for the header it would have removed."""
    stripped = {**AUTH, "X-Offload-Lane": "bogus", "X-Operator-Strip": "1"}
    assert post(server, "/v1/embeddings", {"input": "x"}, stripped).status_code == 200
    # The same header, not stripped: the server's 400.
    assert post(server, "/v1/embeddings", {"input": "x"}, {**AUTH, "X-Offload-Lane": "bogus"}).status_code == 400


def test_the_header_names_only_the_lanes_it_may(server: Server) -> None:
    """`OFFLOAD_VLLM_LANE_HEADER=query`: `query` by header; `bulk`, a lane, not
    by header (400, naming no lane), but by its route."""
    before = queue_waits(server, "query")
    assert post(server, "/v1/embeddings", {"input": "x"}, {**AUTH, "X-Offload-Lane": "query"}).status_code == 200
    assert queue_waits(server, "query") > before
    r = post(server, "/v1/embeddings", {"input": "x"}, {**AUTH, "X-Offload-Lane": "bulk"})
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert message == "X-Offload-Lane: 'bulk' is not a lane this server takes from the header"
    before = queue_waits(server, "bulk")
    assert post(server, "/pooling", {"input": "x"}, AUTH).status_code == 200
    assert queue_waits(server, "bulk") > before


def test_a_lane_header_sent_twice_is_a_400(server: Server) -> None:
    """A proxy that adds its own `X-Offload-Lane` line after the client's: the
    first line was read, so the client's lane stayed in force (200). Both
    lines reach the server; it answers 400 and renders nothing."""
    before = total(scrape(server), "offload_lane_queue_wait_seconds_count")
    # The client's lane first, the proxy's after it: the first was served (200).
    for lines in (["query", "bogus"], ["query", "query"]):
        headers = [("content-type", "application/json"), *AUTH.items(), *(("X-Offload-Lane", v) for v in lines)]
        r = httpx.post(
            f"{server.url}/v1/embeddings", content=encoded(server, {"input": "x"}), headers=headers, timeout=300
        )
        assert r.status_code == 400, r.text[:300]
        assert r.json()["error"]["message"].startswith("X-Offload-Lane is sent 2 times")
    assert total(scrape(server), "offload_lane_queue_wait_seconds_count") == before
    assert post(server, "/v1/embeddings", {"input": "x"}, {**AUTH, "X-Offload-Lane": "query"}).status_code == 200


# ---- the per-request cost cap ----------------------------------------------------------------


def test_a_text_that_begins_like_an_image_costs_its_characters(server: Server) -> None:
    """A 110-character text input beginning `data:image/png;base64,`, its
    header forged to claim 13,000² pixels, on this text-only model: it was
    priced ~16.9 M, past `OFFLOAD_VLLM_MAX_REQUEST_COST` (413); vLLM embeds
    it as the text it is, and so does the adapter."""
    forged = forged_png(13_000, 13_000)
    assert len(forged) == 110
    for path, body in (
        ("/v1/embeddings", {"input": forged}),
        ("/pooling", {"input": [forged] * 3}),
    ):
        r = post(server, path, body, AUTH)
        assert r.status_code == 200, (path, r.text[:300])




def test_a_request_costlier_than_the_cap_is_a_413_before_any_work(server: Server) -> None:
    """A rerank of 3,000 documents against a long query (6.4 M characters of
    pairs, from a 40 kB body) was admitted on an empty queue and then held
    it for seconds; past `OFFLOAD_VLLM_MAX_REQUEST_COST` it is refused."""
    body = {"query": "q" * 2000, "documents": [f"document {i}" for i in range(3000)]}
    before = total(scrape(server), "offload_lane_queue_wait_seconds_count")
    r = post(server, "/v1/rerank", body, AUTH)
    assert r.status_code == 413, r.text[:300]
    error = r.json()["error"]
    assert error["code"] == 413
    assert error["message"].startswith("this request costs 6")
    assert f"OFFLOAD_VLLM_MAX_REQUEST_COST={MAX_REQUEST_COST}" in error["message"]
    assert total(scrape(server), "offload_lane_queue_wait_seconds_count") == before  # nothing rendered
    small = post(server, "/v1/rerank", {"query": "q", "documents": ["a", "b"]}, AUTH)
    assert small.status_code == 200, small.text[:300]


# ---- deep nesting ---------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [600, 900, 5000])
def test_a_deeply_nested_body_gets_vllms_400(server: Server, depth: int) -> None:
    """`/pooling` takes `data` of any shape. The cost walk recursed: nesting
    600 was a 500 (maximum recursion depth), 900 a reset connection. vLLM
    without the plugin answers 400 at every depth (seen: 600 and 900, no IO
    processor plugin; 5000, its parser's error), and so does the adapter."""
    content = '{"model": "minilm", "data": ' + "[" * depth + '"x"' + "]" * depth + "}"
    r = httpx.post(
        f"{server.url}/pooling", content=content, headers={"content-type": "application/json"}, timeout=120
    )
    assert r.status_code == 400, r.text[:300]
    if depth < 1000:
        assert "No IOProcessor plugin installed" in r.json()["error"]["message"]
    else:
        assert r.json() == {"detail": "There was an error parsing the body"}
    assert server.alive()


# ---- the early refusal refuses only what admission would -------------------------------------


def test_the_early_refusal_never_asks_more_than_admission_charges(server: Server) -> None:
    """While a little cost is queued, requests whose bodies are large for what
    they cost (escaped CJK, 6 bytes a character; emoji, 12; token ids, ~7)
    are admitted, as admission charges them well within the bound; the door
    priced them by their bytes and answered 503. Meanwhile an unauthenticated
    request, large enough to be refused, gets vLLM's 401, and no refusal is
    counted."""
    # Holds the one worker for seconds: one prompt of 4 M characters (a single piece).
    hold = {"input": "offload keeps the event loop alive " * 115_000, "truncate_prompt_tokens": 16}
    queued = {"input": "a queued request " * 176, "truncate_prompt_tokens": 16}  # 3,000 characters
    cheap_for_their_bytes = {
        "cjk": {"input": "负载均衡" * 1000, "truncate_prompt_tokens": 16},
        "emoji": {"input": "🚀" * 2000, "truncate_prompt_tokens": 16},
        "token ids": {"input": [[10_000 + 97 * j + i for i in range(100)] for j in range(30)]},
    }
    for body in cheap_for_their_bytes.values():
        assert len(encoded(server, body)) > MAX_QUEUED_COST  # the door refused each of them whenever anything was queued
    before = rejected(server)
    started = queue_waits(server, "default")
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        holding = pool.submit(post, server, "/v1/embeddings", hold, AUTH)
        deadline = time.monotonic() + 120
        # Its one piece has started (its queue wait is counted): nothing is queued.
        while queue_waits(server, "default") <= started:
            assert time.monotonic() < deadline, "the holding request did not start"
            assert not holding.done(), holding.result().text[:300]
            time.sleep(0.01)
        waiting = pool.submit(post, server, "/v1/embeddings", queued, AUTH)
        while total(scrape(server), "offload_lane_queued_cost") <= 0:
            assert not holding.done(), "the holding request ended before the next one queued"
            time.sleep(0.01)
        answers = {name: pool.submit(post, server, "/v1/embeddings", body, AUTH) for name, body in cheap_for_their_bytes.items()}
        unauthenticated = pool.submit(post, server, "/v1/embeddings", {"input": "x" * 300_000})
        statuses = {name: future.result().status_code for name, future in answers.items()}
        assert holding.result().status_code == 200
        assert waiting.result().status_code == 200
    assert statuses == dict.fromkeys(cheap_for_their_bytes, 200), statuses
    assert unauthenticated.result().status_code == 401
    assert rejected(server) == before
