"""Seam: `vllm/entrypoints/pooling/base/serving.py`, `PoolingBaseServing.__call__`.

Every online pooling request (embeddings, classify, score, rerank, pooling)
enters there before anything is rendered. With `VLLM_OFFLOAD_MAX_QUEUE` set, a
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
