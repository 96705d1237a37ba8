"""`Executor`: what users call; it holds a `Strategy` and owns everything cross-cutting."""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar, final

import anyio
import anyio.to_thread
from typing_extensions import ParamSpec, Self

from ._admission import Admission, Limiter, Limits, calls_hold, current_admission, enter, leave
from ._call import Call
from ._call_front import CallOptions
from ._checks import check_cost, check_max_queue, check_max_queued_cost, check_timeout
from ._errors import ConfigError, executor_closed
from ._fork import forget_in_child
from ._lanes import Flow, Lanes
from ._metrics import call_metrics, function_label, metrics_enabled
from ._strategy import Strategy

T = TypeVar("T")
P = ParamSpec("P")

SCHEDULING = ("fair", "fifo")

@final
class Executor(concurrent.futures.Executor):
    """Runs blocking calls away from (or, for `inline`, on) the event loop.

    A `concurrent.futures.Executor` too; every method may be called from any thread.
    """

    def __init__(
        self,
        strategy: Strategy,
        *,
        max_queue: int | None = None,
        max_queued_cost: float | None = None,
        lanes: Mapping[str, float] | None = None,
        scheduling: str = "fair",
    ) -> None:
        """Hold `strategy` and own everything cross-cutting, the same whatever the strategy.

        Build one with `offload.get_executor(name, **options)`, or from a
        strategy object: `Executor(strategy, max_queue=..., lanes=...)`. It can
        be passed to `loop.run_in_executor` or to any API that takes a
        `concurrent.futures.Executor` (`submit`, `map`).

        **Metrics.** With `prometheus_client` installed, every executor feeds the
        `offload_*` metrics (docs/overload.md); `OFFLOAD_METRICS=0` turns them off.

        **Fork.** In a child made by `os.fork()`, the executor forgets the
        parent's workers, queued calls and counts: the child's calls start
        workers of its own.

        Args:
            strategy: the `offload.strategy.Strategy` that runs the calls. The
                executor owns it from now on (one executor per strategy object).
            max_queue: calls that may wait for a worker before new ones fail with
                `Overloaded` (shared by the lanes, see `admission`). `None`
                (default): unbounded.
            max_queued_cost: cost that may be admitted and not started before
                new calls and units fail with `Overloaded` (shared by the lanes,
                see `admission`). `None` (default): unbounded.
            lanes: extra lanes and their weights, `{"query": 4, "ingest": 1}`; the
                lane `"default"` (weight 1 unless given here) always exists.
            scheduling: `"fair"` (default) or `"fifo"`: one queue in arrival order,
                whatever the costs, lanes and flows (lanes still count in the metrics).
        """
        if not isinstance(strategy, Strategy):
            raise ConfigError(f"strategy must be an offload.strategy.Strategy, got {strategy!r}")
        if getattr(strategy, "_offload_executor", None) is not None:
            raise ConfigError(f"{strategy!r} already belongs to an executor; build a new one")
        capacity = strategy.capacity()
        max_queue = check_max_queue(max_queue)
        max_queued_cost = check_max_queued_cost(max_queued_cost)
        for option, value in (("max_queue", max_queue), ("max_queued_cost", max_queued_cost)):
            if value is not None and capacity is None:
                raise ConfigError(
                    f"strategy {strategy.name!r} takes no option {option!r}: it has no queue"
                )
        if scheduling not in SCHEDULING:
            raise ConfigError(f"scheduling must be one of {SCHEDULING}, got {scheduling!r}")
        # The one set of `Lane` objects its calls, queue and bounds share.
        self._lanes = Lanes(lanes)
        self._strategy = strategy
        strategy._offload_executor = self  # type: ignore[attr-defined]
        self._max_queue = max_queue
        self._max_queued_cost = max_queued_cost
        self._scheduling = scheduling
        # FIFO: every call in one flow of the default lane.
        self._fifo = Flow(self._lanes.default) if scheduling == "fifo" else None
        self._closed = False
        self._limiter = self._make_limiter()
        # The one front of a call: `run`, `run_with_timeout` and `submit` are
        # `options()`'s with the defaults (cost 1, the default lane: a call's
        # lane is never unset).
        self._calls = CallOptions(self._start, strategy, 1.0, self._lanes.default)
        forget_in_child(self)

    def _make_limiter(self) -> Limiter | None:
        metrics = metrics_enabled()
        if self._max_queue is None and self._max_queued_cost is None and not metrics:
            return None  # nothing to count: the hot path stays bare
        limits = Limits(self._strategy.capacity(), self._max_queue, self._max_queued_cost)
        listener = call_metrics(self.name, self._lanes) if metrics else None
        return Limiter(self.name, self._lanes, limits, listener)

    # ---- what it is ------------------------------------------------------------

    @property
    def strategy(self) -> Strategy:
        """The strategy that runs this executor's calls."""
        return self._strategy

    @property
    def name(self) -> str:
        """The strategy's registry name (`offload.STRATEGIES`)."""
        return self._strategy.name

    @property
    def carries_context(self) -> bool:
        """Whether `fn` runs in a copy of the caller's `contextvars` context."""
        return self._strategy.carries_context

    @property
    def capacity(self) -> int | None:
        """Calls that run at once (`None`: calls never wait, as with `inline`)."""
        return self._strategy.capacity()

    @property
    def closed(self) -> bool:
        """True once `shutdown` has been called."""
        return self._closed

    @property
    def max_queue(self) -> int | None:
        """Calls that may wait for a worker before `Overloaded` (`None`: unbounded)."""
        return self._max_queue

    @property
    def max_queued_cost(self) -> float | None:
        """Cost that may be admitted and not started before `Overloaded` (`None`: unbounded)."""
        return self._max_queued_cost

    @property
    def lanes(self) -> dict[str, float]:
        """The lanes and their weights."""
        return self._lanes.weights()

    @property
    def scheduling(self) -> str:
        """`"fair"` or `"fifo"`."""
        return self._scheduling

    # ---- calling -------------------------------------------------------------------

    def options(self, *, cost: float = 1.0, lane: str | None = None) -> CallOptions:
        """`run`, `run_with_timeout` and `submit` for calls of `cost` in `lane`.

        `await executor.options(cost=len(text), lane="query").run(fn, text)`.
        Raises `ConfigError` at once for a bad cost or an unknown lane. Inside
        an `admission()` block the block's flow (and lane) wins over `lane`.

        **Cost, lane, flow.** A call's cost is a number in any unit the
        callers agree on (characters, bytes, items; default 1); its lane a
        name from `lanes` (default `"default"`). Calls made inside an
        `admission()` block share one flow.

        **Concurrency bound and order.** At most `capacity` calls run at
        once; the rest wait in the executor's queue, served fairly
        (`scheduling="fair"`, the default): by lane, in proportion to the
        lanes' weights, and within a lane by flow and cost, so a small call
        never waits for another flow's backlog. With every call of cost 1
        and no flows (the defaults), that is first in, first out;
        `scheduling="fifo"` makes it so whatever the costs.
        """
        return CallOptions(self._start, self._strategy, check_cost(cost), self._lanes.lane(lane))

    def _start(self, call: Call[Any]) -> None:
        limiter = self._limiter
        admission = current_admission(self)
        if admission is not None:
            call.lane = admission.flow.lane
            call.flow = admission.flow
        if self._fifo is not None:
            call.flow = self._fifo
        if self._closed:
            if limiter is not None:
                limiter.refused(function_label(call.fn), "closed", call.lane)
            raise executor_closed(self.name)
        if limiter is None:
            self._strategy.schedule(call)
            return
        limiter.admit(call, None if admission is None else calls_hold(admission))
        try:
            self._strategy.schedule(call)
        except BaseException:
            if call.tracker is not None and not call.done:
                limiter.unadmit(call)
            raise

    # ---- admission (the rule and the counts: `_admission.Limiter`) ----------------

    @property
    def overloaded(self) -> bool:
        """True when a unit of work of cost 1 in the default lane would fail
        with `Overloaded` now (`would_refuse` for another cost or lane). A
        hint for refusing work early, not a reservation: another caller may
        take the last place first."""
        limiter = self._limiter
        return limiter is not None and limiter.would_refuse(1.0, self._lanes.default)

    @property
    def in_flight(self) -> int:
        """Calls and `admission()` units in flight now (what `max_queue`
        bounds, with capacity). Counted only where the executor counts
        (`max_queue` or `max_queued_cost` set, or metrics on); else 0."""
        limiter = self._limiter
        return 0 if limiter is None else limiter.inflight

    @property
    def queued_cost(self) -> float:
        """The cost admitted and not started now, in all lanes (what
        `max_queued_cost` bounds): held by `admission()` units (to their
        end, with `keep_cost=True`), of calls queued. Counted only where the
        executor counts (as `in_flight`); else 0."""
        limiter = self._limiter
        return 0.0 if limiter is None else limiter.queued_cost

    def lane_queued_cost(self, lane: str) -> float:
        """`queued_cost` of one lane (by name; `ConfigError` for an unknown one)."""
        chosen = self._lanes.lane(lane)
        limiter = self._limiter
        return 0.0 if limiter is None else limiter.lane_queued_cost(chosen)

    def cost_to_admit(self, *, cost: float = 1.0, lane: str | None = None) -> float | None:
        """How much queued cost must leave (start, or be withdrawn) before
        `admission(cost=cost, lane=lane)` passes `max_queued_cost`, by the
        same rule as `would_refuse`: 0 when it would pass now, `None` where
        no cost bound is set. A snapshot, like `would_refuse`. Raises
        `ConfigError` for a bad cost or an unknown lane."""
        cost = check_cost(cost)
        chosen = self._lanes.lane(lane)
        limiter = self._limiter
        return None if limiter is None else limiter.cost_to_admit(cost, chosen)

    def would_refuse(self, *, cost: float = 1.0, lane: str | None = None) -> bool:
        """True when `admission(cost=cost, lane=lane)` would raise `Overloaded`
        now (by the per-lane rule: docs/lanes.md, "Admission by cost").
        Like `overloaded`, a hint that reserves nothing and counts no
        refusal. Raises `ConfigError` for a bad cost or an unknown lane."""
        cost = check_cost(cost)
        chosen = self._lanes.lane(lane)
        limiter = self._limiter
        return limiter is not None and limiter.would_refuse(cost, chosen)

    @contextlib.contextmanager
    def admission(
        self,
        function: str,
        *,
        cost: float = 1.0,
        lane: str | None = None,
        refuse: bool = True,
        keep_cost: bool = False,
    ) -> Iterator[Admission]:
        """Admission for a unit of work made of several calls (a server request).

        **The bounds.** With `max_queue`, a call that would make more than
        `max_queue` calls wait for a worker (more than capacity +
        `max_queue` in flight) fails at once with `Overloaded`, before
        anything is done for it. With `max_queued_cost`, so does a call (or
        an `admission()` unit) that would bring the cost admitted and not
        started above it. Both bounds are shared by the lanes by weight, so
        that a lane that fills the queue cannot lock the others out, and a
        call costlier than its lane's whole share runs rather than being
        refused forever: the exact rule is on docs/lanes.md ("Admission by
        cost") and on the method that applies it
        (`offload._admission.Limiter._refuses`). An `admission()` unit is
        checked once and never refused halfway.

        On entry, raises `Overloaded` if a call of `cost` made now would be
        refused (a cost above `lane`'s share of `max_queued_cost` is checked
        as that share), counting the refusal in
        `offload_rejected_calls{function=function}` (and by lane): check it
        before parsing or rendering anything. Once admitted, the unit holds
        one place in flight and its `cost` (at most that share), as a queued
        call would, until the block ends or `release()` is called on what the
        block yields, so a burst of requests that arrive together cannot all
        pass the check before any of them has queued a call. Its calls take
        the held cost over as they are queued (a call's own cost is set with
        `options(cost=)`), so it is never counted twice; once it is spent,
        they are counted as they are queued and started, as any call.

        Inside the block (this task, and tasks it starts, which copy its
        `contextvars`), calls on this executor are admitted without a further
        check, so an admitted request is never refused halfway, and they form
        one flow of `lane`: queued behind each other, interleaved fairly with
        other flows. A nested `admission()` is a unit of its own (its own
        place, cost and flow).

        `keep_cost=True`: the unit keeps its whole cost counted until the
        block ends (or `release_cost()`), whatever its calls do: each call of
        the block is paid out of it, up to that cost, and adds to the queued
        cost only what it costs beyond. `max_queued_cost` then bounds the
        cost of units admitted and not over (a server request held until
        it is answered, its wait for an engine included), not only of work
        not started.

        `refuse=False`: admit whatever the bounds (work that must not be
        refused, such as an offline batch); it still holds its place and cost.
        Raises `ConfigError` for an unknown lane or a bad cost.
        """
        cost = check_cost(cost)
        chosen = self._lanes.lane(lane)
        limiter = self._limiter
        hold = None if limiter is None else limiter.hold(cost, chosen, function, refuse=refuse, keep=keep_cost)
        admission = Admission(self, limiter, hold, Flow(chosen))
        token = enter(admission)
        try:
            yield admission
        finally:
            leave(token)
            admission.release()

    def start(self) -> None:
        """Start every worker this executor will use, now, and return once each
        has run its initializer. Idempotent: workers already up are kept.

        Blocks the calling thread (from async code: `await
        anyio.to_thread.run_sync(executor.start)`); it is not cancellable.
        Raises `ExecutorClosed` after shutdown. If a worker cannot start (its
        initializer raises, a process cannot be spawned), raises the error its
        first call would get (`OffloadError`, the cause attached); the workers
        that did start stay up, and the one that failed is started again by
        the next call that needs it (that call never sees this error).
        Strategies without workers (`inline`) have nothing to do. Thread-safe,
        but a `start()` that finds every worker already started (by a
        concurrent `start()`, or by calls) returns without waiting for their
        initializers.
        """
        if self._closed:
            raise executor_closed(self.name)
        self._strategy.start()

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `fn(*args, **kwargs)` under this strategy and return its result.

        Works under asyncio, uvloop and trio. Raises whatever `fn` raises;
        `ExecutorClosed` after shutdown; `Overloaded` at once when the
        executor is full (see `admission`).

        **Errors.** An exception raised by `fn` reaches the caller as the
        same exception object (same type, message and the function's own
        frames in its traceback; for `process`, a faithful copy). Errors of
        `offload` itself derive from `OffloadError`.

        **Cancellation.** Cancelling the task awaiting `run` returns control
        at once. A call that has not started never starts (nor does a
        `submit` whose future was cancelled). A call already running is not
        interrupted (Python cannot interrupt a thread): it finishes in the
        background, its worker stays busy until then (so the concurrency
        bound still holds), and its result is dropped.

        **Context.** `fn` runs in a copy of the caller's `contextvars`
        context, as with `asyncio.to_thread` (a strategy that runs calls in
        another process cannot carry it: `carries_context` is False).

        **Worker state.** With `initializer=`, each worker runs
        `initializer(*initargs)` once, before its first call, and `fn` reads
        the result with `offload.worker_state()`; no two workers share it.
        """
        return await self._calls.run(fn, *args, **kwargs)

    # ASYNC109: not a plain `fail_after`: the deadline is stamped on the call, so a
    # worker that reaches it late skips it even when the loop is slow to notice.
    async def run_with_timeout(
        self,
        timeout: float | None,  # noqa: ASYNC109
        fn: Callable[P, T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """`run(fn, *args, **kwargs)` with a deadline `timeout` seconds from now.

        When it passes first, raises `TimeoutError` at once; a call that had not
        started is dropped and never runs (counted in
        `offload_dropped_calls{reason="deadline"}`), a running one is treated
        like a cancelled call (it finishes in the background, or is killed
        with `process`'s `cancel="kill"`). `timeout=None`: no deadline.
        (The timeout is a separate argument so that `fn` keeps every keyword,
        `timeout=` included.)
        """
        return await self._calls.run_with_timeout(timeout, fn, *args, **kwargs)

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> concurrent.futures.Future[T]:
        """Schedule `fn(*args, **kwargs)` and return a `concurrent.futures.Future`.

        Cancelling the future before the call starts withdraws the call: it
        never runs, and gives its place in the queue back at once.
        """
        return self._calls.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse new calls with `ExecutorClosed`; let queued calls run (or,
        with `cancel_futures=True`, drop them: their callers get
        `ExecutorClosed`, their futures are cancelled); with `wait=True`,
        return once every worker has exited. Idempotent (also `with`,
        `async with`, `aclose()`)."""
        self._closed = True
        self._strategy.shutdown(wait, cancel_futures)

    # ASYNC109: the timeout bounds the wait for running calls, then stops them:
    # more than a `fail_after` around the call could do.
    async def aclose(self, *, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Shut down without blocking the event loop.

        `timeout=None`: `shutdown(wait=True)` (queued calls still run).

        With `timeout` (seconds): graceful shutdown for a server that is going
        away. New calls are refused (`ExecutorClosed`), queued calls fail at
        once with `ExecutorClosed`, running calls get up to `timeout` seconds to
        finish; then the strategy stops what still runs where it can
        (`process` kills its workers, whose callers get `WorkerCrashed`; a
        thread cannot be stopped, so it finishes its call in the background
        and exits). Returns when every worker has exited, or, for threads
        still running a call, right after the timeout.

        A bad `timeout` raises `ConfigError` before anything changes.
        """
        check_timeout(timeout, allow_zero=True)
        self._closed = True
        if timeout is None:
            await anyio.to_thread.run_sync(self.shutdown)
            return
        self._strategy.shutdown(False, True)
        with anyio.move_on_after(timeout):
            await anyio.to_thread.run_sync(self.shutdown, abandon_on_cancel=True)
            return
        if self._strategy.terminate_running():
            await anyio.to_thread.run_sync(self.shutdown)

    def _after_fork_in_child(self) -> None:
        # The parent's calls in flight are not this child's: they must not
        # count against its `max_queue` (it would refuse every call).
        self._limiter = self._make_limiter()
        self._strategy.after_fork_in_child()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<offload.Executor strategy={self.name!r} {state}>"

