"""Seam: vLLM's error answers (`vllm/entrypoints/serve/exception_handling/error_response.py`):
the body and status of the answers the request policy gives (`_admission.Answers`),
so that a refused request reads as vLLM's own."""

from __future__ import annotations

import functools
from http import HTTPStatus
from typing import final

from starlette.responses import JSONResponse
from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
from vllm.exceptions import QueueOverflowError

from .._admission import MAX_REQUEST_COST_SETTING


@final
class VLLMAnswers:
    """`_admission.Answers` in vLLM's error body."""

    # One answer per `Retry-After` value (1 to its cap), built once: under a flood
    # of refusals, building vLLM's error body each time would cost the loop.
    @staticmethod
    @functools.lru_cache(maxsize=64)
    def overflow(retry_after: int) -> JSONResponse:
        """vLLM's own queue-overflow answer (status, body), plus `Retry-After`."""
        error = create_error_response(QueueOverflowError())  # type: ignore[no-untyped-call]
        return JSONResponse(
            error.model_dump(), status_code=error.error.code, headers={"Retry-After": str(retry_after)}
        )

    @staticmethod
    def bad_request(error: ValueError) -> JSONResponse:
        """vLLM's own 400 answer, with `error`'s message."""
        response = create_error_response(str(error))
        return JSONResponse(response.model_dump(), status_code=response.error.code)

    @staticmethod
    def too_costly(cost: float, cap: float, body_bytes: int | None = None) -> JSONResponse:
        """vLLM's error body with HTTP 413: the request's cost, the cap and the setting."""
        costs = f"costs {cost:.12g}" if body_bytes is None else f"of {body_bytes} bytes costs at least {cost:.12g}"
        response = create_error_response(
            f"this request {costs}, more than this server takes in one request "
            f"({MAX_REQUEST_COST_SETTING}={cap:.12g}, in characters of input); send it in smaller requests",
            err_type=HTTPStatus.REQUEST_ENTITY_TOO_LARGE.phrase,
            status_code=HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
        )
        return JSONResponse(response.model_dump(), status_code=response.error.code)


ANSWERS = VLLMAnswers()
