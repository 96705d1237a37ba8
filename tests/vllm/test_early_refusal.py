"""The early-refusal middleware (`OFFLOAD_VLLM_MAX_QUEUE`): a pooling POST that
finds the queue full gets vLLM's 503 before its body is read, on a real
Starlette app in front of a real executor whose one worker is held busy."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import anyio
import httpx
import pytest
from offload_vllm._admission import REQUEST_LABEL, RefuseWhenFull, RequestPolicy
from offload_vllm._lanes import LaneRouter
from offload_vllm._seams.errors import ANSWERS
from prometheus_client import REGISTRY
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import offload

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def busy_executor() -> Iterator[tuple[offload.Executor, threading.Event]]:
    executor = offload.get_executor("thread", max_workers=1, max_queue=0)
    release = threading.Event()
    executor.submit(release.wait, 30)
    try:
        yield executor, release
    finally:
        release.set()
        executor.shutdown()


async def echo(request: Request) -> JSONResponse:
    return JSONResponse({"read": len(await request.body())})


def app_with(executor: offload.Executor, root_path: str = "", max_request_cost: float | None = None) -> httpx.AsyncClient:
    app = Starlette(routes=[Route(p, echo, methods=["GET", "POST"]) for p in ("/v1/embeddings", "/health", "/v1/chat/completions")])
    policy = RequestPolicy(
        executor_of=lambda: executor, router=LaneRouter.of(executor.lanes, {}), engine_priority=False, retry_after=lambda executor, lane, cost: 1, answers=ANSWERS,
        max_request_cost=max_request_cost,
    )
    app.add_middleware(RefuseWhenFull, policy=policy)
    transport = httpx.ASGITransport(app=app, root_path=root_path)
    return httpx.AsyncClient(transport=transport, base_url="http://test")


async def test_a_full_queue_refuses_before_the_body_is_read(
    busy_executor: tuple[offload.Executor, threading.Event],
) -> None:
    executor, release = busy_executor
    labels = {"strategy": "thread", "function": REQUEST_LABEL, "reason": "overloaded"}
    before = REGISTRY.get_sample_value("offload_rejected_calls_total", labels) or 0.0
    async with app_with(executor) as client:
        # Not even JSON: a parsed body would be a 4xx, not vLLM's 503.
        refused = await client.post("/v1/embeddings", content=b"{not json")
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == 503
        assert REGISTRY.get_sample_value("offload_rejected_calls_total", labels) == before + 1
        # Other routes and methods pass through.
        assert (await client.get("/health")).status_code == 200
        assert (await client.post("/v1/chat/completions", content=b"x")).json() == {"read": 1}
        release.set()
        for _ in range(200):  # the held call ends, and its place with it
            if not executor.overloaded:
                break
            await anyio.sleep(0.01)
        admitted = await client.post("/v1/embeddings", content=b"abc")
        assert admitted.json() == {"read": 3}
        assert not executor.overloaded  # the check reserved nothing


@pytest.mark.parametrize("path", ["/api/v1/embeddings", "/v1/embeddings"])
async def test_behind_a_root_path_the_route_is_read_without_it(
    busy_executor: tuple[offload.Executor, threading.Event], path: str
) -> None:
    """As vLLM's own middleware reads it: served with `--root-path /api`, a
    request to `/api/v1/embeddings` (or to `/v1/embeddings`, a proxy having
    removed the prefix) is a pooling route."""
    executor, _ = busy_executor
    async with app_with(executor, root_path="/api") as client:
        refused = await client.post(path, content=b"{not json")
        assert refused.status_code == 503
        assert (await client.post("/api/v1/chat/completions", content=b"x")).status_code != 503


async def test_the_cost_is_the_floor_of_the_content_length() -> None:
    """With a cost bound, a request passes or not by the least it can be
    charged for its `Content-Length` (`body_floor`: 12 bytes a unit), before
    its body is read."""
    executor = offload.get_executor("thread", max_workers=1, max_queued_cost=100)
    try:
        with executor.admission("held", cost=60):  # queued cost: 60 of 100
            async with app_with(executor) as client:
                assert (await client.post("/v1/embeddings", content=b"x" * 480)).json() == {"read": 480}
                refused = await client.post("/v1/embeddings", content=b"x" * 500)
                assert refused.status_code == 503
    finally:
        executor.shutdown()


async def test_a_header_naming_no_lane_is_a_400_before_the_body_is_read() -> None:
    executor = offload.get_executor("thread", max_workers=1, max_queue=4, lanes={"query": 4})
    try:
        async with app_with(executor) as client:
            r = await client.post("/v1/embeddings", content=b"{not json", headers={"X-Offload-Lane": "bulk"})
            assert r.status_code == 400
            assert r.json()["error"]["message"] == "X-Offload-Lane: 'bulk' is not a lane this server takes from the header"
            ok = await client.post("/v1/embeddings", content=b"abc", headers={"X-Offload-Lane": "query"})
            assert ok.json() == {"read": 3}
    finally:
        executor.shutdown()


async def test_a_body_too_large_for_the_request_cost_cap_is_a_413_before_it_is_read() -> None:
    """`OFFLOAD_VLLM_MAX_REQUEST_COST`: a body whose least cost (`body_floor`,
    12 bytes a unit) is past the cap is answered 413, vLLM's error body naming
    the cost, the cap and the setting; one at the cap passes on."""
    executor = offload.get_executor("thread", max_workers=1, max_queued_cost=10_000)
    try:
        async with app_with(executor, max_request_cost=100) as client:
            refused = await client.post("/v1/embeddings", content=b" " * 1212)
            assert refused.status_code == 413
            assert refused.json()["error"] == {
                "message": "this request of 1212 bytes costs at least 101, more than this server takes in one "
                "request (OFFLOAD_VLLM_MAX_REQUEST_COST=100, in characters of input); send it in smaller requests",
                "type": "Request Entity Too Large",
                "param": None,
                "code": 413,
            }
            assert (await client.post("/v1/embeddings", content=b" " * 1200)).json() == {"read": 1200}
    finally:
        executor.shutdown()
