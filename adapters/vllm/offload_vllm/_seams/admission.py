"""Seam: `vllm/entrypoints/pooling/base/serving.py`, `PoolingBaseServing.__call__`.

Every online pooling request (embeddings, classify, score, rerank, pooling)
enters there before anything is rendered. With `OFFLOAD_VLLM_MAX_QUEUE` set, a
request that finds the strategy's queue full is answered at once: HTTP 503
with the JSON body vLLM gives its own `QueueOverflowError`
(`--max-num-queued-reqs`) and a `Retry-After` header. A render or
post-processing call is never refused once its request was admitted
(`Executor.admission`), so no request is dropped halfway through its work. An
admitted request holds one place in the executor's count until its response
is built (rendering, engine and post-processing), so requests in flight are
bounded end to end (as TEI's permits are) and a burst arriving together cannot
all pass the check at once. Measured: releasing the place after rendering let
accepted requests pile up in the engine instead (docs/benchmarks.md#overload).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any

from starlette.responses import JSONResponse
from vllm.entrypoints.pooling.base.serving import PoolingBaseServing
from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
from vllm.exceptions import QueueOverflowError

import offload

_ORIGINAL_CALL: Callable[..., Coroutine[Any, Any, Any]] = PoolingBaseServing.__call__


def overflow_response(retry_after: int) -> JSONResponse:
    """vLLM's own queue-overflow answer (status, body), plus `Retry-After`."""
    error = create_error_response(QueueOverflowError())  # type: ignore[no-untyped-call]
    return JSONResponse(
        error.model_dump(),
        status_code=error.error.code,
        headers={"Retry-After": str(retry_after)},
    )


#: The `function` label of refusals made at the request's entry.
REQUEST_LABEL = "vllm.pooling_request"


def install(executor_of: Callable[[Any], offload.Executor | None], retry_after: int) -> None:
    """`executor_of(serving)`: the strategy's executor for that serving object."""
    if getattr(PoolingBaseServing.__call__, "__offload_vllm__", False):
        return

    @functools.wraps(_ORIGINAL_CALL)
    async def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        executor = executor_of(self)
        if executor is None:
            return await _ORIGINAL_CALL(self, *args, **kwargs)
        try:
            with executor.admission(REQUEST_LABEL):
                return await _ORIGINAL_CALL(self, *args, **kwargs)
        except offload.Overloaded:
            return overflow_response(retry_after)

    __call__.__offload_vllm__ = True  # type: ignore[attr-defined]
    PoolingBaseServing.__call__ = __call__  # type: ignore[method-assign]


# ---- refusing before the body is read: vllm/entrypoints/launchers/app.py -------

#: vLLM's pooling routes (vllm/entrypoints/pooling/*/api_router.py): where a full
#: queue refuses a request before its body is read.
POOLING_PATHS = frozenset(
    {
        "/classify",
        "/pooling",
        "/rerank",
        "/score",
        "/v1/embeddings",
        "/v1/rerank",
        "/v1/score",
        "/v2/embed",
        "/v2/rerank",
    }
)


class RefuseWhenFull:
    """ASGI middleware: a POST to a pooling route that finds the queue full is
    answered 503 (vLLM's queue-overflow body, `Retry-After`) before its body is
    read, so a refusal costs the event loop no JSON parsing and no pydantic
    validation. The check is `Executor.admission` entered and left at once: it
    counts the refusal in `offload_rejected_calls_total` and reserves nothing,
    so a request that passes here is admitted for real (and may still be
    refused) at the serving seam, as before."""

    def __init__(
        self, app: Any, executor_of: Callable[[], offload.Executor | None], retry_after: int
    ) -> None:
        self.app = app
        self._executor_of = executor_of
        self._refusal = overflow_response(retry_after)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in POOLING_PATHS:
            executor = self._executor_of()
            if executor is not None:
                try:
                    with executor.admission(REQUEST_LABEL):
                        pass
                except offload.Overloaded:
                    await self._refusal(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def install_early_refusal(executor_of: Callable[[], offload.Executor | None], retry_after: int) -> None:
    """Add `RefuseWhenFull` outside vLLM's own middleware, where vLLM builds its app."""
    from vllm.entrypoints.launchers import app as app_module

    original: Callable[..., None] = getattr(app_module, "init_entrypoints_middleware")  # noqa: B009
    if getattr(original, "__offload_vllm__", False):
        return

    @functools.wraps(original)
    def init_entrypoints_middleware(args: Any, app: Any, supported_tasks: Any) -> None:
        original(args, app, supported_tasks)
        # Added last, so outermost: it runs before CORS, authentication and the
        # HTTP metrics (a refusal here is counted by offload's metrics only).
        app.add_middleware(RefuseWhenFull, executor_of=executor_of, retry_after=retry_after)

    init_entrypoints_middleware.__offload_vllm__ = True  # type: ignore[attr-defined]
    setattr(app_module, "init_entrypoints_middleware", init_entrypoints_middleware)  # noqa: B010
