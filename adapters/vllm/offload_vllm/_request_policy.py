"""The request policy: what a pooling request costs, which lane it joins, whether
it is admitted, its engine priority, and the answers it gets when it is not.

Imports no vLLM: the seams call it (`_seams/serving.py` at every pooling
serving object's `__call__`, the door middlewares of `_door.py` before the
body is read), handing it what only vLLM's objects can tell (the request's
cost, whether it set its own priority) and the answers in vLLM's own words
(`Answers`, made by `_seams/errors.py`).

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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.datastructures import Headers

import offload

from . import _phases as phases
from ._cost import TooDeep
from ._lanes import DEFAULT_LANE, LANE_HEADER, LaneRouter, UnknownLane
from ._priority import engine_priority
from ._routes import route_of

#: The `function` label of refusals made at the request's entry.
REQUEST_LABEL = "vllm.pooling_request"

#: The setting named in a 413's message (`_options`' `max_request_cost` row).
MAX_REQUEST_COST_SETTING = "OFFLOAD_VLLM_MAX_REQUEST_COST"

# The admission a request runs inside: a `__call__` it enters from there (a
# subclass's calling the base one) must not admit it again, and its
# preprocessing's end gives its held cost back (`preprocessed`).
_admitted: contextvars.ContextVar[tuple[offload.Admission, RequestPolicy] | None] = contextvars.ContextVar(
    "offload_vllm_admitted", default=None
)


class Answers(Protocol):
    """The answers of a refused request, each an ASGI app (a Starlette response),
    in vLLM's own error body (`_seams/errors.py`)."""

    def overflow(self, retry_after: int) -> Any:
        """503, vLLM's queue-overflow body, and `Retry-After`."""

    def bad_request(self, error: ValueError) -> Any:
        """400 with `error`'s message (`UnknownLane`, `TooDeep`)."""

    def too_costly(self, cost: float, cap: float, body_bytes: int | None = None) -> Any:
        """413 naming the cost (at least `cost`, for a body of `body_bytes` not read yet), the cap and the setting."""


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
    answers: Answers
    #: Told the lane of each request as it is admitted, and `(lane, cost)` of
    #: it once it is answered (its admission ended): what the `Retry-After`
    #: is measured from (a lane's served rate, over the time it was busy).
    started: Callable[[str | None], None] = lambda lane: None
    served: Callable[[str | None, float], None] = lambda lane, cost: None
    #: Told, on the loop's thread, each time admission's counts changed: a
    #: request admitted, its cost released, its admission ended; and before
    #: each admission decision and after each refusal (readiness publishes
    #: what admission would do now: counts also change where admission does
    #: not see it, as a call started or queued on a worker).
    changed: Callable[[], None] = lambda: None
    #: Told `(lane, admitted)` of each admission decision, on the loop's
    #: thread, at once (between the `changed` before it and the one after
    #: it): the request admitted, or refused
    #: because a bound is full (here or at the door). What readiness answered
    #: at that moment is counted from it (`_health.Health.admission_decided`).
    decided: Callable[[str | None, bool], None] = lambda lane, admitted: None
    #: A request costlier than this is answered 413 (`OFFLOAD_VLLM_MAX_REQUEST_COST`).
    max_request_cost: float | None = None

    def lane_of(self, scope: Any) -> str | None:
        """The lane of the request of ASGI `scope` (`None`: default); `UnknownLane`
        for a header naming a lane it may not name."""
        if scope is None:
            return None
        return self.router.lane_from(route_of(scope), Headers(scope=scope).getlist(LANE_HEADER))

    async def admit(
        self,
        scope: Any,
        cost_of: Callable[[], float],
        set_priority: Callable[[int], None] | None,
        call: Callable[[], Awaitable[Any]],
    ) -> Any:
        """`await call()` inside the request's admission, or the answer that refuses it.

        `scope` is the request's ASGI scope (`None` offline), `cost_of()` its
        cost (may raise `TooDeep`), `set_priority` sets its engine priority
        (`None`: the client set one). A request already admitted (a serving
        `__call__` entered from another) and any request before the executor
        is built just `call()`.
        """
        executor = self.executor_of()
        if executor is None or _admitted.get() is not None:
            return await call()
        try:
            lane = self.lane_of(scope)
            cost = cost_of()
        except (UnknownLane, TooDeep) as exc:
            return self.answers.bad_request(exc)
        if self.max_request_cost is not None and cost > self.max_request_cost:
            return self.answers.too_costly(cost, self.max_request_cost)
        if self.engine_priority and set_priority is not None:
            set_priority(engine_priority(cost, executor.lanes[DEFAULT_LANE if lane is None else lane]))
        with contextlib.ExitStack() as held:
            held.callback(self.changed)  # last, once the admission has ended
            self.changed()  # readiness as it stands at this decision (`changed`)
            try:
                admitted = held.enter_context(executor.admission(REQUEST_LABEL, cost=cost, lane=lane))
            except offload.Overloaded:
                self.decided(lane, False)
                return self.answers.overflow(self.retry_after(executor, lane, cost))
            self.decided(lane, True)
            self.changed()
            self.started(lane)
            held.callback(self.served, lane, cost)
            held.callback(_admitted.reset, _admitted.set((admitted, self)))
            phases.admitted(lane)
            return await call()


def preprocessed() -> None:
    """The current request's preprocessing (rendering) is over: the cost it
    was admitted with leaves `OFFLOAD_VLLM_MAX_QUEUED_COST` now, whether its
    rendering ran on the executor or on the event loop (where no executor
    call took the cost over), so a request that waits for the engine holds
    its place but no queued cost. Nothing outside an admitted request."""
    current = _admitted.get()
    if current is not None:
        admitted, policy = current
        admitted.release_cost()
        policy.changed()


def content_length(scope: Any) -> int:
    """The request's `Content-Length` (0 without one, or a bad one)."""
    try:
        return max(0, int(Headers(scope=scope).get("content-length", "0")))
    except ValueError:
        return 0
