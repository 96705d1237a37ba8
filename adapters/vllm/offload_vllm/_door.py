"""The door: ASGI middlewares a pooling request passes before its body is read.

Added inside vLLM's own middleware and the operator's (`--middleware`), after
authentication, where vLLM builds its app (`_seams/app.py`, in the order
`register` gives): a request they refuse never reaches them. Imports no vLLM.
"""

from __future__ import annotations

from typing import Any, final

import offload

from ._cost import body_floor
from ._lanes import UnknownLane
from ._request_policy import REQUEST_LABEL, RequestPolicy, content_length
from ._routes import is_pooling_request


@final
class RequestsInFlight:
    """Pooling requests past the door (`CountRequests`) and not yet answered:
    async-renderer's batches wait for more calls only while this is more than
    the batch holds (the strategy's `in_flight`), so a lone request never
    waits and, under load, requests that arrive close together share a
    tokenizer call. Changed on the event loop's thread only; calling it (from
    the worker thread) reads one int."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> int:
        return self.count


class RefuseWhenFull:
    """ASGI middleware: a POST to a pooling route (after `--root-path`, as vLLM
    reads it: `routes.route_of`) that finds the executor full is answered 503
    (vLLM's queue-overflow body, `Retry-After`) before its body is read, so a
    refusal costs the event loop no JSON parsing and no pydantic validation
    (why: docs/decisions/0011-refuse-before-reading-the-body.md).
    The cost is `_cost.body_floor` of the body's `Content-Length` (0 without
    the header): the least admission can charge the request, so this refuses
    nothing admission would admit. The lane is the request's. The check is
    `Executor.admission` entered and left at once: it counts the refusal in
    `offload_rejected_calls_total` and reserves nothing, so a request that
    passes here is admitted for real (and may still be refused) at the
    serving seam; a refusal here is an admission decision
    (`RequestPolicy.decided`). A header naming a lane the server does not take is
    answered 400 here already, and a request whose least cost is past
    `OFFLOAD_VLLM_MAX_REQUEST_COST`, 413."""

    def __init__(self, app: Any, policy: RequestPolicy) -> None:
        self.app = app
        self._policy = policy

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        policy = self._policy
        executor = policy.executor_of()
        if executor is not None and is_pooling_request(scope):
            try:
                lane = policy.lane_of(scope)
            except UnknownLane as exc:
                await policy.answers.bad_request(exc)(scope, receive, send)
                return
            body_bytes = content_length(scope)
            cost = body_floor(body_bytes)
            cap = policy.max_request_cost
            if cap is not None and cost > cap:
                await policy.answers.too_costly(cost, cap, body_bytes)(scope, receive, send)
                return
            policy.changed()  # readiness as it stands at this decision (`RequestPolicy.changed`)
            try:
                with executor.admission(REQUEST_LABEL, cost=cost, lane=lane):
                    pass
            except offload.Overloaded:
                policy.decided(lane, False)
                retry_after = policy.retry_after(executor, lane, cost)
                policy.changed()
                await policy.answers.overflow(retry_after)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class CountRequests:
    """ASGI middleware: counts a POST to a pooling route in `RequestsInFlight`
    until its answer is sent (or it fails, or its client leaves). Inside
    every other middleware, so a request refused before it is never counted."""

    def __init__(self, app: Any, count: RequestsInFlight) -> None:
        self.app = app
        self._count = count

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if not is_pooling_request(scope):
            await self.app(scope, receive, send)
            return
        self._count.count += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self._count.count -= 1
