"""Seam: `vllm/entrypoints/pooling/base/serving.py`, the `__call__` of every pooling serving class.

Every online pooling request (embeddings, pooling, classify, score, rerank,
`/v2/embed`) enters a pooling serving object's `__call__` before anything is
rendered. `PoolingBaseServing.__call__` is one entry, but a serving class may
define its own: `ServingScores.__call__` runs late-interaction scoring
(`flash_late_interaction`) without calling the base one. So every `__call__`
defined along a served class's bases is wrapped (`cover`, as each serving
object is built), and a request is admitted at the first one it enters;
the ones it enters from there (`ServingScores.__call__` calling the base
one) find it admitted and hold nothing more.

Admission (`Executor.admission`) happens before any work, with the request's
cost (`_cost.py`, read from its fields) in its lane (`_lanes.py`). A request
that finds the executor full (`OFFLOAD_VLLM_MAX_QUEUE`,
`OFFLOAD_VLLM_MAX_QUEUED_COST`) is answered at once: HTTP 503 with the JSON
body vLLM gives its own `QueueOverflowError` (`--max-num-queued-reqs`) and a
`Retry-After` header computed from the rate its lane has been served
(`_retry_after.py`). Once admitted, its render and post-processing calls
are one flow of its lane, never refused, so no request is dropped halfway
through its work. It holds one place in the executor's count until its
response is built (rendering, engine and post-processing), so requests in
flight are bounded end to end (as TEI's permits are) and a burst arriving
together cannot all pass the check at once. Measured: releasing the place
after rendering let accepted requests pile up in the engine instead
(docs/benchmarks.md#overload). Its cost, though, is what rendering it
costs: it leaves the cost bound once its preprocessing is over
(`preprocessed`), wherever that ran.

A request costlier than `OFFLOAD_VLLM_MAX_REQUEST_COST` is answered 413
(vLLM's error body, naming its cost, the cap and the setting) before
admission, and one whose inputs nest past `_cost.MAX_DEPTH`, vLLM's 400.

With engine priority on, the request's `priority` is set from its cost and
lane first (`_priority.py`), unless the client set one.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, final

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from vllm.entrypoints.pooling.base.serving import PoolingBaseServing
from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
from vllm.exceptions import QueueOverflowError

import offload

from .. import _phases as phases
from .._cost import TooDeep, body_floor
from .._lanes import DEFAULT_LANE, LANE_HEADER, LaneRouter, UnknownLane
from .._priority import engine_priority
from . import requests as requests_seam
from .routes import is_pooling_request, route_of

#: The `function` label of refusals made at the request's entry.
REQUEST_LABEL = "vllm.pooling_request"

# The admission a request runs inside: a `__call__` it enters from there (a
# subclass's calling the base one) must not admit it again, and its
# preprocessing's end gives its held cost back (`preprocessed`).
_admitted: contextvars.ContextVar[offload.Admission | None] = contextvars.ContextVar(
    "offload_vllm_admitted", default=None
)

_MARK = "__offload_vllm__"


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


@dataclass(frozen=True)
class RequestPolicy:
    """What admitting a request takes: the executor, lanes, and what the answers say."""

    #: The strategy's executor once built (`None` before: vLLM's own behaviour).
    executor_of: Callable[[], offload.Executor | None]
    router: LaneRouter
    #: Set each request's engine priority from its cost and lane.
    engine_priority: bool
    #: The `Retry-After` of a 503, in seconds, for `(executor, lane, cost)`
    #: of the request refused (`_retry_after.DrainRates.retry_after`).
    retry_after: Callable[[offload.Executor, str | None, float], int]
    #: Told `(lane, cost)` of each admitted request once it is answered (its
    #: admission ended): what the `Retry-After` is measured from.
    served: Callable[[str | None, float], None] = lambda lane, cost: None
    #: Told, on the loop's thread, each time admission's counts changed: a
    #: request admitted, its cost released, its admission ended; and after
    #: each refusal (readiness publishes what admission would do now).
    changed: Callable[[], None] = lambda: None
    #: A request costlier than this is answered 413 (`OFFLOAD_VLLM_MAX_REQUEST_COST`).
    max_request_cost: float | None = None


# One answer per `Retry-After` value (1 to its cap), built once: under a flood
# of refusals, building vLLM's error body each time would cost the loop.
@functools.lru_cache(maxsize=64)
def overflow_response(retry_after: int) -> JSONResponse:
    """vLLM's own queue-overflow answer (status, body), plus `Retry-After`."""
    error = create_error_response(QueueOverflowError())  # type: ignore[no-untyped-call]
    return JSONResponse(
        error.model_dump(),
        status_code=error.error.code,
        headers={"Retry-After": str(retry_after)},
    )


def bad_request_response(error: ValueError) -> JSONResponse:
    """vLLM's own 400 answer, with `error`'s message (`UnknownLane`, `TooDeep`)."""
    response = create_error_response(str(error))
    return JSONResponse(response.model_dump(), status_code=response.error.code)


#: The setting named in a 413's message (`_config.MAX_REQUEST_COST_ENV`; not
#: imported: the settings module is not loaded where this one is tested alone).
MAX_REQUEST_COST_SETTING = "OFFLOAD_VLLM_MAX_REQUEST_COST"


def too_costly_response(cost: float, cap: float, body_bytes: int | None = None) -> JSONResponse:
    """vLLM's error body with HTTP 413: the request's cost (at least `cost`,
    for a body of `body_bytes` not read yet), the cap and the setting."""
    costs = f"costs {cost:.12g}" if body_bytes is None else f"of {body_bytes} bytes costs at least {cost:.12g}"
    response = create_error_response(
        f"this request {costs}, more than this server takes in one request "
        f"({MAX_REQUEST_COST_SETTING}={cap:.12g}, in characters of input); send it in smaller requests",
        err_type=HTTPStatus.REQUEST_ENTITY_TOO_LARGE.phrase,
        status_code=HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    )
    return JSONResponse(response.model_dump(), status_code=response.error.code)


def _lane_of(policy: RequestPolicy, scope: Any) -> str | None:
    if scope is None:
        return None
    return policy.router.lane_from(route_of(scope), Headers(scope=scope).getlist(LANE_HEADER))


def _request_and_scope(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """`(request, raw request's ASGI scope or None)` from a `__call__(request, raw_request)`."""
    request = args[0] if args else kwargs["request"]
    raw_request = args[1] if len(args) > 1 else kwargs.get("raw_request")
    return request, None if raw_request is None else raw_request.scope


def _admitting(
    original: Callable[..., Coroutine[Any, Any, Any]], policy: RequestPolicy
) -> Callable[..., Coroutine[Any, Any, Any]]:
    @functools.wraps(original)
    async def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        executor = policy.executor_of()
        if executor is None or _admitted.get() is not None:
            return await original(self, *args, **kwargs)
        request, scope = _request_and_scope(args, kwargs)
        try:
            lane = _lane_of(policy, scope)
            cost = requests_seam.request_cost(
                request, 0 if scope is None else content_length(scope), multimodal=requests_seam.takes_images(self)
            )
        except (UnknownLane, TooDeep) as exc:
            return bad_request_response(exc)
        if policy.max_request_cost is not None and cost > policy.max_request_cost:
            return too_costly_response(cost, policy.max_request_cost)
        if policy.engine_priority and not requests_seam.sets_own_priority(request):
            weight = executor.lanes[DEFAULT_LANE if lane is None else lane]
            requests_seam.set_engine_priority(request, engine_priority(cost, weight))
        with contextlib.ExitStack() as held:
            held.callback(policy.changed)  # last, once the admission has ended
            try:
                admitted = held.enter_context(executor.admission(REQUEST_LABEL, cost=cost, lane=lane))
            except offload.Overloaded:
                return overflow_response(policy.retry_after(executor, lane, cost))
            policy.changed()
            held.callback(policy.served, lane, cost)
            held.callback(_admitted.reset, _admitted.set(admitted))
            phases.admitted(lane)
            return await original(self, *args, **kwargs)

    setattr(__call__, _MARK, True)
    return __call__


def preprocessed() -> None:
    """The current request's preprocessing (rendering) is over: the cost it
    was admitted with leaves `OFFLOAD_VLLM_MAX_QUEUED_COST` now, whether its
    rendering ran on the executor or on the event loop (where no executor
    call took the cost over), so a request that waits for the engine holds
    its place but no queued cost. Nothing outside an admitted request."""
    admitted = _admitted.get()
    if admitted is not None:
        admitted.release_cost()
        if _policy is not None:
            _policy.changed()


_policy: RequestPolicy | None = None


def install(policy: RequestPolicy) -> None:
    """Admit every pooling request (`cover` each serving class as it is used)."""
    global _policy
    _policy = policy
    cover(PoolingBaseServing)


def cover(cls: type) -> None:
    """Wrap every `__call__` defined along `cls`'s bases, from `PoolingBaseServing`
    down, once (a no-op before `install`)."""
    if _policy is None:
        return
    for klass in cls.__mro__:
        own = vars(klass).get("__call__")
        if own is not None and issubclass(klass, PoolingBaseServing) and not getattr(own, _MARK, False):
            setattr(klass, "__call__", _admitting(own, _policy))  # noqa: B010


# ---- refusing before the body is read: vllm/entrypoints/launchers/app.py -------


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
    serving seam. A header naming a lane the server does not take is
    answered 400 here already, and a request whose least cost is past
    `OFFLOAD_VLLM_MAX_REQUEST_COST`, 413.

    It runs inside vLLM's middleware and the operator's (`--middleware`),
    after authentication: a request they refuse never reaches it."""

    def __init__(self, app: Any, policy: RequestPolicy) -> None:
        self.app = app
        self._policy = policy

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        executor = self._policy.executor_of()
        if executor is not None and is_pooling_request(scope):
            try:
                lane = _lane_of(self._policy, scope)
            except UnknownLane as exc:
                await bad_request_response(exc)(scope, receive, send)
                return
            body_bytes = content_length(scope)
            cost = body_floor(body_bytes)
            cap = self._policy.max_request_cost
            if cap is not None and cost > cap:
                await too_costly_response(cost, cap, body_bytes)(scope, receive, send)
                return
            try:
                with executor.admission(REQUEST_LABEL, cost=cost, lane=lane):
                    pass
            except offload.Overloaded:
                retry_after = self._policy.retry_after(executor, lane, cost)
                self._policy.changed()
                await overflow_response(retry_after)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def content_length(scope: Any) -> int:
    """The request's `Content-Length` (0 without one, or a bad one)."""
    try:
        return max(0, int(Headers(scope=scope).get("content-length", "0")))
    except ValueError:
        return 0


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


def install_door(policy: RequestPolicy, *, refuse: bool, in_flight: RequestsInFlight | None) -> None:
    """Where vLLM builds its app, add inside vLLM's own middleware and the
    operator's: `RefuseWhenFull` if `refuse`, and `CountRequests` (innermost)
    if `in_flight` is given."""
    from vllm.entrypoints.launchers import app as app_module

    original: Callable[..., None] = getattr(app_module, "init_entrypoints_middleware")  # noqa: B009
    if getattr(original, _MARK, False) or not (refuse or in_flight is not None):
        return

    @functools.wraps(original)
    def init_entrypoints_middleware(args: Any, app: Any, supported_tasks: Any) -> None:
        # Added before vLLM's (CORS, `--api-key` authentication, `--middleware`),
        # so inside them all: a request they refuse gets their answer and
        # nothing from offload (no lane named, no 503, no refusal counted).
        # Starlette makes the last added the outermost.
        if in_flight is not None:
            app.add_middleware(CountRequests, count=in_flight)
        if refuse:
            app.add_middleware(RefuseWhenFull, policy=policy)
        original(args, app, supported_tasks)

    setattr(init_entrypoints_middleware, _MARK, True)
    setattr(app_module, "init_entrypoints_middleware", init_entrypoints_middleware)  # noqa: B010
