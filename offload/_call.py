"""`Call`: one offloaded call, the unit every strategy schedules.

A call is created by `Executor.run` or `Executor.submit`, handed to the
strategy, claimed by exactly one worker (or dropped before that), and finished
exactly once. Its state changes under one lock, so a caller that cancels and a
worker that claims can never both win. Timestamps are taken here, once, for
every strategy (queue wait and run time come from them).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from ._fork import reset_in_child
from ._initializer_state import _NO_STATE, _swap_state

if TYPE_CHECKING:
    from ._lanes import Flow, Lane

T = TypeVar("T")

PENDING = "pending"
RUNNING = "running"
FINISHED = "finished"
CANCELLED = "cancelled"

#: Why a call was withdrawn before it started (`Tracker.withdrawn`'s reasons).
DEADLINE = "deadline"
SHUTDOWN = "shutdown"


class Tracker(Protocol):
    """What an executor attaches to its calls to see them move (admission
    counts, metrics). Called from any thread, once per transition."""

    def started(self, call: Call[Any]) -> None: ...

    def finished(self, call: Call[Any]) -> None: ...

    def withdrawn(self, call: Call[Any], reason: str) -> None: ...


# One lock for every call: it is held for a few bytecodes, and one lock a call
# would cost an allocation on the hot path.
_state_lock = threading.Lock()


@reset_in_child
def _fresh_state_lock() -> None:
    # A thread of the parent may have held it at the fork; none holds it here.
    global _state_lock
    _state_lock = threading.Lock()



#: `(queued_at, started_at, finished_at)` of one finished call (`time.perf_counter()`).
CallTimes = tuple[float, float, float]

_call_times: contextvars.ContextVar[list[CallTimes] | None] = contextvars.ContextVar(
    "offload_call_times", default=None
)


@contextlib.contextmanager
def collect_call_times() -> Iterator[list[CallTimes]]:
    """Within the block, every call made in this context (by `run`, `submit`
    or an `Executor.options` front, under any strategy) appends its
    `(queued_at, started_at, finished_at)` (`time.perf_counter()`, taken in
    this process) to the list it yields, once it finishes; a call withdrawn
    before it started appends nothing.

    For a server that decomposes a request's time (how long its calls waited
    for a worker, how long they ran). Calls append from their workers'
    threads, possibly after the block ended (a call still running when its
    caller left); read the list on the caller's side once its calls are
    awaited. A task started inside the block inherits it (its context is a
    copy), as `contextvars` do. Blocks nest: the innermost list collects."""
    times: list[CallTimes] = []
    token = _call_times.set(times)
    try:
        yield times
    finally:
        _call_times.reset(token)


class Call(Generic[T]):
    """What to run (`fn(*args, **kwargs)` inside `context`) and, later, its outcome.

    The executor makes one per `run`/`submit` and hands it to its strategy,
    whose worker calls `claim()` right before running it, then `execute(state)`
    (or, for a worker in another process, `set_result` / `set_exception` on
    this side). Every method may be called from any thread; a call ends exactly once.
    """

    #: The lane it is counted in: one of its executor's `Lane` objects,
    #: stamped by the executor before the call reaches its strategy (the
    #: executor's default lane when the caller named none); never `None`.
    #: Unset until then.
    lane: Lane

    __slots__ = (
        "_exception",
        "_result",
        "_state",
        "args",
        "context",
        "cost",
        "deadline",
        "finished_at",
        "flow",
        "fn",
        "kwargs",
        "lane",
        "metrics",
        "on_claim",
        "on_done",
        "queued_at",
        "queued_units",
        "started_at",
        "stopped_by",
        "times",
        "tracker",
    )

    def __init__(
        self,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        context: contextvars.Context | None = None,
    ) -> None:
        #: The function to run, its positional and keyword arguments.
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        #: A copy of the caller's context, which `execute` runs `fn` in (`None`:
        #: run it as is). A strategy whose workers are other processes cannot
        #: carry it (it sets `carries_context = False`) and sends `fn`, `args`
        #: and `kwargs` only.
        self.context = context
        self._state = PENDING
        self._result: T | None = None
        self._exception: BaseException | None = None
        #: Called (from any thread) once the call is finished or dropped.
        self.on_done: Callable[[], None] | None = None
        #: Called under claim; returning False vetoes the start (a cancelled future).
        self.on_claim: Callable[[], bool] | None = None
        #: `time.perf_counter()` when it was made, when `claim` succeeded and
        #: when it ended (0 before).
        self.queued_at = time.perf_counter()
        self.started_at = 0.0
        self.finished_at = 0.0
        #: Where it reports its times once finished (`collect_call_times`), read
        #: here, in its caller's context.
        self.times = _call_times.get()
        #: `time.perf_counter()` after which the call must not start (`claim`
        #: enforces it; `None`: no deadline).
        self.deadline: float | None = None
        #: Told of every state change (admission counts, metrics); set by the executor.
        self.tracker: Tracker | None = None
        #: The tracker's per-function metric handles, looked up once per call.
        self.metrics: Any = None
        #: What the call costs to run, in the unit its executor's callers chose
        #: (1 unless given): queues serve flows fairly by cost, admission bounds it.
        self.cost: float = 1.0
        #: What its admission added to the executor's queued cost, in the
        #: limiter's units (`_admission.Limiter.admit`): its cost, less what an
        #: admission that keeps its cost paid for (`Executor.admission(keep_cost=True)`).
        self.queued_units = 0
        #: The flow it shares a fair share with (`None`: a flow of its own).
        self.flow: Flow | None = None
        #: Set when offload itself stopped the worker running this call (its
        #: owner was cancelled, its deadline passed, `aclose(timeout=)`): the
        #: reason (`CANCELLED`, `DEADLINE`, `SHUTDOWN`), so that its end is not
        #: counted as a crash.
        self.stopped_by: str | None = None

    @property
    def state(self) -> str:
        """`"pending"`, `"running"` (claimed), `"finished"` or `"cancelled"` (withdrawn)."""
        return self._state

    @property
    def done(self) -> bool:
        """Whether the call ended: finished, or withdrawn before it started."""
        return self._state in (FINISHED, CANCELLED)

    def claim(self) -> bool:
        """Mark the call as started; False if it was cancelled or dropped first.

        A worker calls this right before running the call and skips the call
        when it returns False. This is what makes "a cancelled call that has not
        started never starts" hold for every strategy.
        """
        now = time.perf_counter()
        with _state_lock:
            if self._state is not PENDING:
                return False
            if self.deadline is not None and now > self.deadline:
                self._state = CANCELLED
                expired = True
            else:
                self._state = RUNNING
                expired = False
        if expired:
            # Its owner may be waiting still (the loop was late to notice the
            # deadline): tell it, with the reason.
            self._exception = TimeoutError(
                f"the call's deadline passed {now - self.deadline:.3f}s before a worker "  # type: ignore[operator]
                "could start it; it did not run"
            )
            self._withdrawn(DEADLINE)
            self._notify()
            return False
        if self.on_claim is not None and not self.on_claim():
            self._state = CANCELLED
            self._withdrawn(CANCELLED)
            return False
        self.started_at = now
        if self.tracker is not None:
            self.tracker.started(self)
        return True

    def cancel(self, reason: str = CANCELLED) -> bool:
        """Withdraw a call that has not started. True if it will never run.

        The owner (the cancelled caller) is gone, so nobody is notified.
        `reason` (`CANCELLED`, `DEADLINE` or `SHUTDOWN`) is what the tracker counts.
        """
        with _state_lock:
            if self._state is not PENDING:
                return False
            self._state = CANCELLED
        self._withdrawn(reason)
        return True

    def drop(self) -> bool:
        """Withdraw a call that has not started and tell its owner (shutdown with
        `cancel_futures=True`). True if it will never run."""
        if not self.cancel(SHUTDOWN):
            return False
        self._notify()
        return True

    def _withdrawn(self, reason: str) -> None:
        if self.tracker is not None:
            self.tracker.withdrawn(self, reason)

    def stop(self, reason: str) -> None:
        """For strategies: offload is about to kill the worker running this
        call, for `reason` (`CANCELLED`, `DEADLINE` or `SHUTDOWN`). The call
        still ends (with `WorkerCrashed`, if anyone waits), but it is counted
        as stopped for that reason, not as a crash."""
        if self.stopped_by is None:
            self.stopped_by = reason

    def execute(self, state: Any = _NO_STATE) -> None:
        """Run a claimed call on this thread, with `state` as its `worker_state()`."""
        previous = _swap_state(state)
        try:
            if self.context is None:
                result = self.fn(*self.args, **self.kwargs)
            else:
                result = self.context.run(self.fn, *self.args, **self.kwargs)
        except BaseException as exc:
            self.set_exception(exc)
        else:
            self.set_result(result)
        finally:
            _swap_state(previous)

    def set_result(self, result: T) -> None:
        """End a claimed call with `result` and wake its caller (for a worker
        in another process: what came back). Call it once, after `claim()`."""
        self._result = result
        self._finish()

    def set_exception(self, exception: BaseException) -> None:
        """End a claimed call with `exception`, which its caller gets raised
        (from another process: `offload.strategy.portable_error` keeps its
        traceback). Call it once, after `claim()`; a strategy may also fail a
        call it could not run (say, its arguments do not pickle)."""
        self._exception = exception
        self._finish()

    def _finish(self) -> None:
        self.finished_at = time.perf_counter()
        self._state = FINISHED
        if self.times is not None:
            self.times.append((self.queued_at, self.started_at, self.finished_at))
        if self.tracker is not None:
            self.tracker.finished(self)
        self._notify()

    @property
    def error(self) -> BaseException | None:
        """The exception of a finished call (until `outcome()` takes it), or why
        a withdrawn call did not run when its owner should be told (the
        `TimeoutError` of a deadline that passed in the queue); else `None`."""
        return self._exception

    def _notify(self) -> None:
        on_done, self.on_done = self.on_done, None
        if on_done is not None:
            on_done()

    def outcome(self) -> T:
        """Return the result or raise the exception of a finished call (once:
        references are released so large results and tracebacks are not kept)."""
        exception, self._exception = self._exception, None
        result, self._result = self._result, None
        if exception is not None:
            try:
                raise exception
            finally:
                del exception
        return result  # type: ignore[return-value]
