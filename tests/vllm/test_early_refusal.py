"""The door's middlewares: the early refusal (`RefuseWhenFull`): a pooling
POST that finds a bound full gets vLLM's 503 before its body is read; and
`HoldUntilAnswered`: what an admitted request holds is given back once its
answer is sent or its client has gone. On a real Starlette (or FastAPI, with
vLLM's own cancellation on disconnect) app in front of a real executor."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator

import anyio
import httpx
import pytest
from fastapi import FastAPI
from offload_vllm._admission import (
    REQUEST_LABEL,
    EngineRequests,
    HoldUntilAnswered,
    RefuseWhenFull,
    RequestPolicy,
)
from offload_vllm._lanes import LaneRouter
from offload_vllm._seams.errors import ANSWERS
from prometheus_client import REGISTRY
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from vllm.entrypoints.serve.utils.api_utils import with_cancellation

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
    app = Starlette(routes=[Route(p, echo, methods=["GET", "POST"]) for p in ("/v1/embeddings", "/health", "/v1/chat/completions", "/tokenize")])
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
        # A generate route is refused the same way; other routes and methods pass through.
        assert (await client.post("/v1/chat/completions", content=b"{not json")).status_code == 503
        assert (await client.get("/health")).status_code == 200
        assert (await client.post("/tokenize", content=b"x")).json() == {"read": 1}
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
        assert (await client.post("/api/tokenize", content=b"x")).status_code != 503


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


# ---- held until answered (`HoldUntilAnswered`) -------------------------------------------


def served_app(policy: RequestPolicy, handler: object) -> FastAPI:
    """vLLM's shape of a pooling app, in small: a FastAPI route cancelled on a
    client's disconnect by vLLM's own `with_cancellation`, behind the door
    (`RefuseWhenFull` outside `HoldUntilAnswered`, as `register` adds them)."""
    app = FastAPI()
    app.add_api_route("/v1/embeddings", with_cancellation(handler), methods=["POST"])
    app.add_middleware(HoldUntilAnswered)
    app.add_middleware(RefuseWhenFull, policy=policy)
    return app


def policy_of(executor: offload.Executor, engine: EngineRequests | None = None) -> RequestPolicy:
    return RequestPolicy(
        executor_of=lambda: executor, router=LaneRouter.of(executor.lanes, {}), engine_priority=False,
        retry_after=lambda executor, lane, cost: 7, answers=ANSWERS, engine=engine,
    )


async def test_an_admitted_request_holds_its_cost_place_and_engine_requests_until_its_last_chunk_is_sent() -> None:
    """Its render call ran and finished, its handler returned a streamed body:
    what it was admitted with is still held while the body is sent, and a
    request that does not fit is refused at the door (503, the computed
    `Retry-After`) meanwhile; all of it is given back once the last chunk is."""
    executor = offload.get_executor("thread", max_workers=1, max_queued_cost=1000)
    engine = EngineRequests(limit=20)
    policy = policy_of(executor, engine)
    seen: list[tuple[float, int, int, int]] = []
    refused: list[httpx.Response] = []
    client: httpx.AsyncClient

    async def handler(raw_request: Request) -> StreamingResponse:
        async def rendered() -> StreamingResponse:
            assert await executor.options(cost=600).run(sum, [1, 2]) == 3  # its "render", run and over

            async def body() -> AsyncIterator[bytes]:
                for chunk in (b"a", b"b"):
                    seen.append((executor.queued_cost, executor.in_flight, engine.requests, engine.held))
                    if len(seen) == 1:
                        refused.append(await client.post("/v1/embeddings", content=b"x" * 12))
                    yield chunk

            return StreamingResponse(body())

        answer: StreamingResponse = await policy.admit(raw_request.scope, lambda: 600.0, None, rendered, lambda: 16)
        return answer

    transport = httpx.ASGITransport(app=served_app(policy, handler))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            r = await client.post("/v1/embeddings", content=b"{}")
            assert r.status_code == 200
            assert r.content == b"ab"
            assert seen == [(600.0, 1, 1, 16), (600.0, 1, 1, 16)]
            assert refused[0].status_code == 503
            assert refused[0].headers["retry-after"] == "7"
            assert (executor.queued_cost, executor.in_flight, engine.requests, engine.held) == (0.0, 0, 0, 0)
    finally:
        executor.shutdown()


async def test_past_max_num_queued_reqs_a_request_is_refused_at_the_door_before_its_body_is_read() -> None:
    """vLLM's `--max-num-queued-reqs` of 16, a request of 16 engine requests
    held: the next one is refused by the door, its body never read; a request
    of 17 is refused at the seam (before rendering) even alone."""
    executor = offload.get_executor("thread", max_workers=1)
    engine = EngineRequests(limit=16)
    policy = policy_of(executor, engine)
    release, held = anyio.Event(), anyio.Event()
    read: list[int] = []

    async def handler(raw_request: Request) -> JSONResponse:
        read.append(len(await raw_request.body()))
        inputs = int((await raw_request.body()).decode() or "16")

        async def served() -> JSONResponse:
            held.set()
            await release.wait()
            return JSONResponse({"ok": True})

        answer: JSONResponse = await policy.admit(raw_request.scope, lambda: 1.0, None, served, lambda: inputs)
        return answer

    transport = httpx.ASGITransport(app=served_app(policy, handler))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client, anyio.create_task_group() as tg:
            answers: list[httpx.Response] = []

            async def first() -> None:
                answers.append(await client.post("/v1/embeddings", content=b"16"))

            tg.start_soon(first)
            await held.wait()
            assert engine.held == 16
            refused = await client.post("/v1/embeddings", content=b"1")
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "7"
            assert read == [2]  # the refused request's body was never read
            release.set()
        assert answers[0].status_code == 200
        assert engine.held == 0
        alone = await httpx.AsyncClient(transport=transport, base_url="http://test").post("/v1/embeddings", content=b"17")
        assert alone.status_code == 503
        assert engine.held == 0
    finally:
        executor.shutdown()


async def test_a_client_that_goes_away_mid_request_gives_back_what_it_held() -> None:
    """vLLM cancels the handler of a client that disconnected
    (`with_cancellation`) and returns before the cancelled handler has
    unwound: what the request held is given back all the same, once it has."""
    executor = offload.get_executor("thread", max_workers=1, max_queued_cost=1000)
    engine = EngineRequests(limit=20)
    policy = policy_of(executor, engine)
    admitted = anyio.Event()

    async def handler(raw_request: Request) -> JSONResponse:
        async def forever() -> JSONResponse:
            admitted.set()
            try:
                await anyio.sleep_forever()
            finally:
                await anyio.sleep(0.05)  # an engine's abort, after the door has returned
            raise AssertionError("unreachable")

        answer: JSONResponse = await policy.admit(raw_request.scope, lambda: 600.0, None, forever, lambda: 4)
        return answer

    app = served_app(policy, handler)
    gone = anyio.Event()
    messages = iter([{"type": "http.request", "body": b"{}", "more_body": False}])

    async def receive() -> dict[str, object]:
        message = next(messages, None)
        if message is not None:
            return message
        await admitted.wait()
        gone.set()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, object]) -> None:
        pass

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/v1/embeddings", "raw_path": b"/v1/embeddings", "root_path": "", "query_string": b"",
        "headers": [(b"content-length", b"2"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
    }
    try:
        await app(scope, receive, send)
        assert gone.is_set()
        for _ in range(200):
            if (executor.queued_cost, executor.in_flight, engine.requests, engine.held) == (0.0, 0, 0, 0):
                break
            await anyio.sleep(0.01)
        assert (executor.queued_cost, executor.in_flight, engine.requests, engine.held) == (0.0, 0, 0, 0)
    finally:
        executor.shutdown()
