"""Admission of a pooling or generate request: the rule, the counts it reads, its listeners.

- **The rule**, once: `RequestPolicy._decide`, the one sequence the door
  (`RefuseWhenFull`, before the body is read) and the serving seam
  (`RequestPolicy.admit`, at every pooling serving object's `__call__`,
  `_seams/serving.py`, and the generate routes' handlers, `_seams/generate.py`) both run: the request's lane and cost (one
  `Priced`), the cap on one request's cost (413), `Executor.admission` in
  its lane, and the answer that refuses it (503 with `Retry-After`, in
  vLLM's words: `Answers`, made by `_seams/errors.py`).
- **The counts** are the executor's (`offload.Executor.admission`), read by
  `Readiness` here (`would_refuse`) and by `Retry-After` (`cost_to_admit`,
  in `_retry_after.DrainRates`): if the core's admission changes shape,
  these two are what to re-point. Beside them, `EngineRequests` counts the
  engine requests of the requests admitted and not answered, against vLLM's
  `--max-num-queued-reqs`.
- **The listeners** (`AdmissionListener`, subscribed in `register`):
  readiness (`_health.Health`), `Retry-After`'s served rates
  (`_retry_after.DrainRates`) and the request's phases (`_phases.LISTENER`).

Admission happens before any work, with the request's cost (`_cost.py`,
read from its fields) in its lane (`_lanes.py`). Once admitted, its render
and post-processing calls are one flow of its lane, never refused, so no
request is dropped halfway through its work. It holds one place in the
executor's count, its whole cost (`Executor.admission(keep_cost=True)`) and
its engine requests until its answer's last byte is sent or its client has
gone (`HoldUntilAnswered`): rendering, the engine's queue and forward pass,
post-processing and the response. So the bounds bound the server's whole
backlog end to end (as TEI's permits are), a burst arriving together cannot
all pass the check at once, and an admitted request waits behind at most a
bound's worth of work. Measured: releasing the place after rendering let
accepted requests pile up in the engine instead (docs/benchmarks.md#overload),
and releasing the cost there did the same under a cost bound (a flood of
admitted requests waited past their clients' 30 s).

Imports no vLLM. Everything here runs on the event loop's thread.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, final

from starlette.datastructures import Headers

import offload

from ._cost import TooDeep, body_floor
from ._lanes import DEFAULT_LANE, LANE_HEADER, LaneRouter, UnknownLane
from ._metric_family import once_per_process
from ._routes import is_admitted_request, is_pooling_request, route_of

#: The `function` label of refusals made at the request's entry.
REQUEST_LABEL = "vllm.request"

#: The setting named in a 413's message (`_options`' `max_request_cost` row).
MAX_REQUEST_COST_SETTING = "OFFLOAD_VLLM_MAX_REQUEST_COST"


@dataclass(frozen=True)
class Priced:
    """A request as admission sees it: its cost, its lane (a name the
    executor has; `DEFAULT_LANE` when the request names none) and the engine
    requests it will make (at least; 1 at the door, before its body is read)."""

    cost: float
    lane: str = DEFAULT_LANE
    engine_requests: int = 1


#: The gauges of what admitted requests hold until they are answered (`report`):
#: set at each change, not read at each scrape (`set_function`), which
#: Prometheus's multiprocess mode (vLLM's with `--api-server-count` > 1) never
#: collects; summed over the live API server processes.
_held_families = once_per_process(
    lambda prometheus_client: (
        prometheus_client.Gauge(
            "offload_vllm_admitted_requests",
            "Requests admitted and not yet answered (held until the answer's last byte is sent).",
            multiprocess_mode="livesum",
        ),
        prometheus_client.Gauge(
            "offload_vllm_admitted_engine_requests",
            "Engine requests of the requests admitted and not yet answered (what "
            "vLLM's --max-num-queued-reqs bounds, counted from admission on).",
            multiprocess_mode="livesum",
        ),
    )
)


def report(engine: EngineRequests) -> None:
    """Export `engine`'s counts as gauges, set at each change, where metrics are on."""
    if offload.metrics_enabled():
        requests, engine_requests = _held_families()

        def changed(counts: EngineRequests) -> None:
            requests.set(counts.requests)
            engine_requests.set(counts.held)

        engine.changed = changed
        changed(engine)


@final
class EngineRequests:
    """The engine requests of the requests admitted and not yet
    answered (`held`), against vLLM's `--max-num-queued-reqs` (`limit`;
    `None`: not set, nothing refused). vLLM counts a request's engine
    requests only as rendering hands them to the engine, and refuses the one
    past its limit there, after its rendering was paid (`check_admission`,
    vllm/v1/engine/async_llm.py); counted here from admission on, at no fewer
    than the engine requests a request makes (`_seams/requests.engine_requests`),
    the request that would pass it is refused before it is rendered, and
    vLLM's check never refuses an admitted one. Counted per API server
    process: with `--api-server-count N` vLLM counts every process's
    requests together (`SharedAdmissionStats`), so each process's `limit` is
    its share of vLLM's (`_runtime.server_share`), and the shares add up to
    it. Changed on the loop's thread."""

    __slots__ = ("changed", "held", "limit", "requests")

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        #: Engine requests of the requests admitted and not answered.
        self.held = 0
        #: Pooling requests admitted and not answered.
        self.requests = 0
        #: Told after each change (`report`'s gauges).
        self.changed: Callable[[EngineRequests], None] | None = None

    def refuses(self, engine_requests: int) -> bool:
        """Whether a request of `engine_requests` would pass the limit now
        (vLLM's rule: the count plus this request's over the limit)."""
        return self.limit is not None and self.held + engine_requests > self.limit

    @contextlib.contextmanager
    def hold(self, engine_requests: int) -> Iterator[None]:
        self.held += engine_requests
        self.requests += 1
        if self.changed is not None:
            self.changed(self)
        try:
            yield
        finally:
            self.held -= engine_requests
            self.requests -= 1
            if self.changed is not None:
                self.changed(self)


class AdmissionListener:
    """What hears of admission, on the loop's thread; each method a no-op, a
    listener overrides what it needs (`RequestPolicy.subscribe`)."""

    def changed(self, executor: offload.Executor) -> None:
        """Admission's counts may have changed: a request admitted, its cost
        released, its admission ended; and before each decision and after
        each refusal (counts also change where admission does not see it, as
        a call started or queued on a worker)."""

    def priced(self, request: Priced) -> None:
        """`request` was priced at the serving seam (its lane and full cost
        known, under the cap), before its decision and the `changed` before it.
        Not at the door: its price there is only the body's floor, below what
        the seam finds, and would pull a mean of prices down."""

    def decided(self, request: Priced, admitted: bool) -> None:
        """`request` was admitted, or refused because a bound is full (at the
        door or at the seam); between the `changed` before it and the one after."""

    def admitted(self, request: Priced) -> None:
        """`request` was admitted: its lane is busy until it is `answered`."""

    def answered(self, request: Priced) -> None:
        """`request`'s admission ended (its response is built, or it failed)."""


class Answers(Protocol):
    """The answers of a refused request, each an ASGI app (a Starlette response),
    in vLLM's own error body (`_seams/errors.py`)."""

    def overflow(self, retry_after: int) -> Any:
        """503, vLLM's queue-overflow body, and `Retry-After`."""

    def bad_request(self, error: ValueError) -> Any:
        """400 with `error`'s message (`UnknownLane`, `TooDeep`)."""

    def too_costly(self, cost: float, cap: float, body_bytes: int | None = None) -> Any:
        """413 naming the cost (at least `cost`, for a body of `body_bytes` not read yet), the cap and the setting."""


# The admission a request runs inside: a `__call__` it enters from there (a
# subclass's calling the base one) must not admit it again.
_admitted: contextvars.ContextVar[offload.Admission | None] = contextvars.ContextVar(
    "offload_vllm_admitted", default=None
)


@final
class RequestPolicy:
    """What admitting a request takes: the executor, its lanes, the answers,
    and the listeners told of each decision."""

    def __init__(
        self,
        *,
        executor_of: Callable[[], offload.Executor | None],
        router: LaneRouter,
        engine_priority: bool,
        retry_after: Callable[[offload.Executor, str, float], int],
        answers: Answers,
        max_request_cost: float | None = None,
        engine: EngineRequests | None = None,
    ) -> None:
        """`executor_of`: the strategy's executor once built (`None` before:
        vLLM's own behaviour). `engine_priority`: set each request's engine
        priority from its cost and lane (`engine_priority`). `retry_after`:
        the `Retry-After` of a 503, in seconds, for `(executor, lane, cost)`
        of the request refused (`_retry_after.DrainRates.retry_after`).
        `max_request_cost`: a request costlier is answered 413. `engine`:
        the engine requests held, against vLLM's `--max-num-queued-reqs`."""
        self.executor_of = executor_of
        self.router = router
        self.engine_priority = engine_priority
        self.retry_after = retry_after
        self.answers = answers
        self.max_request_cost = max_request_cost
        self.engine = EngineRequests() if engine is None else engine
        self._listeners: tuple[AdmissionListener, ...] = ()

    def subscribe(self, listener: AdmissionListener) -> None:
        """Tell `listener` of admission from now on (in subscription order)."""
        self._listeners = (*self._listeners, listener)

    def changed(self, executor: offload.Executor) -> None:
        for listener in self._listeners:
            listener.changed(executor)

    def lane_of(self, scope: Any) -> str:
        """The lane of the request of ASGI `scope` (`DEFAULT_LANE` offline);
        `UnknownLane` for a header naming a lane it may not name."""
        if scope is None:
            return DEFAULT_LANE
        lane = self.router.lane_from(route_of(scope), Headers(scope=scope).getlist(LANE_HEADER))
        return DEFAULT_LANE if lane is None else lane

    def _decide(
        self,
        held: contextlib.ExitStack | None,
        executor: offload.Executor,
        scope: Any,
        cost_of: Callable[[], float],
        set_priority: Callable[[int], None] | None = None,
        body_bytes: int | None = None,
        engine_requests_of: Callable[[], int] = lambda: 1,
    ) -> tuple[Priced, offload.Admission | None] | Any:
        """The admission rule of a request, at the door and at the seam: its
        `Priced` (400 for an unknown lane or inputs nested too deep), 413 past
        the cap, its engine priority (`set_priority`, unless `None`), then
        its engine requests (`engine_requests_of()`, against vLLM's
        `--max-num-queued-reqs`: `EngineRequests`) and `Executor.admission`
        (keeping its cost), held on `held` (`None`, the door: entered and
        left at once, reserving nothing); the answer that refuses it (503
        with `Retry-After`), or what it was admitted as."""
        try:
            lane = self.lane_of(scope)
            request = Priced(cost_of(), lane, max(1, engine_requests_of()))
        except (UnknownLane, TooDeep) as exc:
            return self.answers.bad_request(exc)
        cap = self.max_request_cost
        if cap is not None and request.cost > cap:
            return self.answers.too_costly(request.cost, cap, body_bytes)
        if self.engine_priority and set_priority is not None:
            set_priority(engine_priority(request.cost, executor.lanes[request.lane]))
        if held is not None:  # the seam's full price, not the door's floor
            for listener in self._listeners:
                listener.priced(request)
        self.changed(executor)  # readiness as it stands at this decision
        admitted: offload.Admission | None = None
        try:
            if self.engine.refuses(request.engine_requests):
                raise offload.Overloaded("the engine requests admitted fill --max-num-queued-reqs")
            admission = executor.admission(REQUEST_LABEL, cost=request.cost, lane=request.lane, keep_cost=True)
            if held is None:
                with admission:
                    pass
            else:
                held.callback(self.changed, executor)  # last, once the admission has ended
                admitted = held.enter_context(admission)
                held.enter_context(self.engine.hold(request.engine_requests))
        except offload.Overloaded:
            for listener in self._listeners:
                listener.decided(request, False)
            answer = self.answers.overflow(self.retry_after(executor, request.lane, request.cost))
            if held is None:
                self.changed(executor)
            return answer
        return request, admitted

    async def admit(
        self,
        scope: Any,
        cost_of: Callable[[], float],
        set_priority: Callable[[int], None] | None,
        call: Callable[[], Awaitable[Any]],
        engine_requests_of: Callable[[], int] = lambda: 1,
    ) -> Any:
        """`await call()` inside the request's admission (the serving seam),
        or the answer that refuses it.

        `scope` is the request's ASGI scope (`None` offline), `cost_of()` its
        cost (may raise `TooDeep`), `set_priority` sets its engine priority
        (`None`: the client set one), `engine_requests_of()` the engine
        requests it makes, at least. A request already admitted (a serving
        `__call__` entered from another) and any request before the executor
        is built just `call()`. What the request was admitted with is held
        until its answer is sent (`HoldUntilAnswered`, where the request
        passed it), else until `call()` returns.
        """
        executor = self.executor_of()
        if executor is None or _admitted.get() is not None:
            return await call()
        with contextlib.ExitStack() as held:
            decided = self._decide(held, executor, scope, cost_of, set_priority, engine_requests_of=engine_requests_of)
            if not isinstance(decided, tuple):
                return decided
            request, admitted = decided
            assert admitted is not None
            for listener in self._listeners:
                listener.decided(request, True)
            self.changed(executor)
            for listener in self._listeners:
                listener.admitted(request)
                held.callback(listener.answered, request)
            token = _admitted.set(admitted)
            try:
                return await call()
            finally:
                _admitted.reset(token)
                answering = _answering.get()
                if answering is not None:
                    answering.keep(held)


@final
class _Answering:
    """What a request admitted at the serving seam holds until the door sees
    its answer sent (`HoldUntilAnswered`)."""

    __slots__ = ("held", "over")

    def __init__(self) -> None:
        self.held = contextlib.ExitStack()
        self.over = False

    def keep(self, held: contextlib.ExitStack) -> None:
        """Hold what `held` holds until `close`; left now if that was already
        (the handler's task outlived the door: cancelled by a disconnect)."""
        if self.over:
            held.close()
        else:
            self.held.push(held.pop_all())

    def close(self) -> None:
        self.over = True
        self.held.close()


# The request the handler serves, as the door saw it come in (`HoldUntilAnswered`).
_answering: contextvars.ContextVar[_Answering | None] = contextvars.ContextVar(
    "offload_vllm_answering", default=None
)


# ---- the door: ASGI middlewares an admitted route's request passes before its body is read ----
#
# Added inside vLLM's own middleware and the operator's (`--middleware`), after
# authentication, where vLLM builds its app (`_seams/app.py`, in the order
# `register` gives): a request they refuse never reaches them.


class Refusal(Exception):
    """Admission's answer (`answer`, an ASGI app: the 503, 413 or 400) for a
    handler whose route cannot return one: vLLM's generate routers take any
    object but their own error and answer types for a stream. Raised there
    (`_seams/generate.py`), it passes vLLM's exception handlers (none is
    registered for it but the catch-all's, outside the middleware) up to
    `HoldUntilAnswered`, which sends it."""

    def __init__(self, answer: Any) -> None:
        super().__init__("refused at admission")
        self.answer = answer


class HoldUntilAnswered:
    """ASGI middleware: what a POST to a pooling or generate route was admitted with at
    the serving seam (its place, cost and engine requests, its listeners'
    `answered`) is held until the app returns here: its answer's last byte
    was handed to the server, or its client went away (vLLM cancels the
    handler on a disconnect), or it failed. Not only until the handler
    returned: the bounds then count a response being encoded and sent too.
    A `Refusal` raised on the way is answered here."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if not is_admitted_request(scope):
            await self.app(scope, receive, send)
            return
        answering = _Answering()
        token = _answering.set(answering)
        try:
            await self.app(scope, receive, send)
        except Refusal as refusal:
            await refusal.answer(scope, receive, send)
        finally:
            _answering.reset(token)
            answering.close()


class RefuseWhenFull:
    """ASGI middleware: a POST to a pooling or generate route that finds the executor full
    is refused by `RequestPolicy._decide` before its body is read, so a
    refusal costs the event loop no JSON parsing and no pydantic validation
    (why: docs/decisions/0011-refuse-before-reading-the-body.md).

    The cost is `_cost.body_floor` of the body's `Content-Length` (0 without
    the header): the least admission can charge the request, so this refuses
    nothing admission would admit. The admission is entered and left at
    once: it counts a refusal in `offload_rejected_calls_total` and reserves
    nothing, so a request that passes here is admitted for real (and may
    still be refused) at the serving seam."""

    def __init__(self, app: Any, policy: RequestPolicy) -> None:
        self.app = app
        self._policy = policy

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        policy = self._policy
        executor = policy.executor_of()
        if executor is not None and is_admitted_request(scope):
            body_bytes = content_length(scope)
            decided = policy._decide(None, executor, scope, lambda: body_floor(body_bytes), body_bytes=body_bytes)
            if not isinstance(decided, tuple):
                await decided(scope, receive, send)
                return
        await self.app(scope, receive, send)


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


class CountRequests:
    """ASGI middleware: counts a POST to a pooling route in `RequestsInFlight`
    until its answer is sent (or it fails, or its client leaves). Inside
    every other middleware, so a request refused before it is never counted.
    Not a generate route's: a streaming answer stays in flight long after its
    one tokenization, and would keep every batch waiting out its window."""

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


def content_length(scope: Any) -> int:
    """The request's `Content-Length` (0 without one, or a bad one)."""
    try:
        return max(0, int(Headers(scope=scope).get("content-length", "0")))
    except ValueError:
        return 0


# ---- what the adapter reads of admission's counts ------------------------------------

#: Readiness, once 503, turns 200 again only when a request of this many times
#: the typical cost would be admitted: a bound that frees room for one request
#: at a time (one answered every few ms under a flood) and fills again at once
#: would otherwise turn readiness over at every answer.
READY_AGAIN_FACTOR = 2.0


@final
class Readiness:
    """Whether readiness answers 503 for admission's sake (`refuses`)."""

    __slots__ = ("_engine", "_typical_cost", "_typical_engine_requests", "refusing")

    def __init__(
        self,
        typical_cost: Callable[[], float] = lambda: 1.0,
        engine: EngineRequests | None = None,
        typical_engine_requests: Callable[[], float] = lambda: 1.0,
    ) -> None:
        #: The cost of a typical request of the default lane now: the mean of
        #: the requests priced of late, admitted or refused, this one included
        #: (`DrainRates.typical_cost`), so known from the first decision on.
        self._typical_cost = typical_cost
        #: The engine requests held (`RequestPolicy.engine`), and a typical
        #: request's (`DrainRates.typical_engine_requests`).
        self._engine = EngineRequests() if engine is None else engine
        self._typical_engine_requests = typical_engine_requests
        #: What `refuses` last said.
        self.refusing = False

    def refuses(self, executor: offload.Executor) -> bool:
        """Readiness's rule, applied now: 503 from when a request of the typical
        cost in the default lane would be refused (the places of
        `OFFLOAD_VLLM_MAX_QUEUE` full, or the room under
        `OFFLOAD_VLLM_MAX_QUEUED_COST` below that cost), until one of
        `READY_AGAIN_FACTOR` times that cost would be admitted. A unit of cost
        1, the rule before, fits in a bound that refuses every real request
        (thousands of characters each). Under vLLM's `--max-num-queued-reqs`
        (`EngineRequests`), 503 while a typical request's engine requests
        would not fit, both ways, as for the places of
        `OFFLOAD_VLLM_MAX_QUEUE`: engine requests come back a request's
        worth at a time, and each is taken by the next request admitted, so
        waiting for room for two kept readiness at 503 through admissions
        (the overload suite's flood: 13 to 15 a level)."""
        factor = READY_AGAIN_FACTOR if self.refusing else 1.0
        engine_requests = math.ceil(self._typical_engine_requests())
        self.refusing = self._engine.refuses(engine_requests) or executor.would_refuse(
            cost=factor * self._typical_cost()
        )
        return self.refusing


# ---- engine priority (`OFFLOAD_VLLM_ENGINE_PRIORITY`) -----------------------------------

#: The level of a quotient too large for a float (the largest finite float's
#: bit length is `sys.float_info.max_exp`, 1024): the last of all.
MAX_LEVEL = sys.float_info.max_exp + 1


def engine_priority(cost: float, lane_weight: float) -> int:
    """The engine priority of a request of `cost` in a lane of `lane_weight`
    (lower runs first), from 0 to `MAX_LEVEL`; never raises for a cost >= 0
    and a weight > 0, however large or small.

    vLLM's `--scheduling-policy priority` runs lower values first, then
    earlier arrivals. A request gets the bit length of its cost divided by
    its lane's weight: a request half as costly, or in a lane of twice the
    weight, is one level ahead; requests within a factor of two of each
    other share a level and keep their arrival order. A request that sets
    its own `priority` keeps it (vLLM honours it without the adapter too)."""
    ratio = cost / lane_weight
    if math.isnan(ratio) or ratio < 1:
        return 0
    if math.isinf(ratio):
        return MAX_LEVEL
    return int(ratio).bit_length()
