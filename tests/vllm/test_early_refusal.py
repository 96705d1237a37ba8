"""The early-refusal middleware (`OFFLOAD_VLLM_MAX_QUEUE`): a pooling POST that
finds the queue full gets vLLM's 503 before its body is read, on a real
Starlette app in front of a real executor whose one worker is held busy."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import anyio
import httpx
import pytest
from offload_vllm._seams.admission import REQUEST_LABEL, RefuseWhenFull
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


def app_with(executor: offload.Executor) -> httpx.AsyncClient:
    app = Starlette(routes=[Route(p, echo, methods=["GET", "POST"]) for p in ("/v1/embeddings", "/health", "/v1/chat/completions")])
    app.add_middleware(RefuseWhenFull, executor_of=lambda: executor, retry_after=1)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


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
