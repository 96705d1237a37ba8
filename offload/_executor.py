"""The one strategy interface: `Executor`."""

from __future__ import annotations

import abc
import concurrent.futures
import contextlib
import contextvars
import math
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, ClassVar, TypeVar, final

import anyio
import anyio.to_thread
from typing_extensions import ParamSpec, Self

from ._call import CANCELLED, DEADLINE, Call
from ._errors import ConfigError, ExecutorClosed
from ._metrics import CallTracker, check_max_queue, function_label, metrics_enabled
from ._waiter import checkpoint_if_cancelled, current_waiter

T = TypeVar("T")
P = ParamSpec("P")

# The executor whose `admission()` block the current task is in.
_admitted: contextvars.ContextVar[Executor | None] = contextvars.ContextVar(
    "offload_admitted", default=None
)


@final
class Admission:
    """The place an admitted unit of work holds (`Executor.admission`)."""

    __slots__ = ("_tracker",)

    def __init__(self, tracker: CallTracker | None) -> None:
        self._tracker = tracker

    def release(self) -> None:
        """Give the place back (idempotent); calls made later in the block are still admitted."""
        tracker, self._tracker = self._tracker, None
        if tracker is not None:
            tracker.unhold()


class Executor(concurrent.futures.Executor, abc.ABC):
    """Runs blocking calls away from (or, for `inline`, on) the event loop.

    Every strategy is an `Executor`, and every strategy follows these rules:

    **Calling.** `await executor.run(fn, *args, **kwargs)` runs `fn(*args, **kwargs)`
    under the strategy and returns its result. It works under asyncio, uvloop and
    trio. `submit`/`map` give the same from synchronous code through
    `concurrent.futures.Future`, so an executor can be passed to
    `loop.run_in_executor` or to any API that takes a `concurrent.futures.Executor`.

    **Errors.** An exception raised by `fn` reaches the caller as the same
    exception object (same type, message and the function's own frames in its
    traceback; for `process`, a faithful copy). Errors of `offload` itself
    derive from `OffloadError`.

    **Cancellation.** Cancelling the task awaiting `run` returns control at once.
    A call that has not started never starts. A call already running is not
    interrupted (Python cannot interrupt a thread): it finishes in the
    background, its worker stays busy until then (so the concurrency bound
    still holds), and its result is dropped.

    **Concurrency bound.** At most `max_workers` calls run at once; the rest wait
    in first-in, first-out order.

    **Context.** `fn` runs in a copy of the caller's `contextvars` context, as
    with `asyncio.to_thread` (the `process` strategy cannot carry it across the
    process boundary and says so).

    **Worker state.** With `initializer=`, each worker runs
    `initializer(*initargs)` once, before its first call, and `fn` reads the
    result with `offload.worker_state()`; no two workers share it.

    **Start-up.** Workers start on demand, at the first calls. `start()`
    starts and warms them all now (a server calls it before it opens its
    port, so no worker is spawned under load unless one dies).

    **Shutdown.** `shutdown(wait=True)` (also `with`, `async with`, `aclose()`)
    refuses new calls with `ExecutorClosed`, lets queued calls run (or, with
    `cancel_futures=True`, drops them: their callers get `ExecutorClosed`, their
    futures are cancelled), and with `wait=True` returns once every worker has
    exited. It is idempotent.

    **Admission.** A strategy with a queue takes `max_queue` (default `None`:
    unbounded). A call that would make more than `max_queue` calls wait for a
    worker fails at once with `Overloaded`, before anything is done for it.

    **Deadlines.** `run_with_timeout(timeout, fn, ...)` (and
    `make_async(timeout=...)`) gives the call `timeout` seconds: when they
    pass, the caller gets `TimeoutError` at once, and a call still queued is
    dropped and never runs (a worker that reaches it late skips it too). A
    running call is treated as a cancelled one.

    **Metrics.** With `prometheus_client` installed, every executor feeds the
    `offload_*` metrics (docs/overload.md); `OFFLOAD_METRICS=0` turns them off.

    **Graceful shutdown.** `aclose(timeout=t)` refuses new calls, fails queued
    ones with `ExecutorClosed`, lets running calls finish for up to `t`
    seconds, then stops what still runs where the strategy can (`process`
    kills its workers: their callers get `WorkerCrashed`; a thread cannot be
    stopped and finishes its call in the background).

    **Thread-safety.** All methods may be called from any thread.

    Writing a strategy: subclass, set `name`, and implement `_schedule` and
    `_shutdown`. Admission, deadlines and metrics belong here, around
    `_schedule`, not in strategies.
    """

    #: The registry name of the strategy (`offload.STRATEGIES`).
    name: ClassVar[str]

    #: Whether `fn` runs in a copy of the caller's `contextvars` context. A
    #: strategy that runs calls in another process cannot carry it: False.
    carries_context: ClassVar[bool] = True

    _closed: bool = False
    _max_queue: int | None = None
    # Made at the first call (strategies need not call a base __init__); None
    # when there is nothing to count (no max_queue, metrics off).
    _tracker: CallTracker | None = None
    _tracker_made: bool = False

    # ---- the strategy's part ----------------------------------------------

    @abc.abstractmethod
    def _schedule(self, call: Call[Any]) -> None:
        """Arrange for `call` to run: a worker must `call.claim()` it, then
        `call.execute(state)` (or `set_result`/`set_exception`).

        Must not block (except `inline`, which runs the call right here), must
        raise `ExecutorClosed` if shutdown has begun, and must be race-free
        against `_shutdown` (queue nothing a shutdown would miss).
        """

    @abc.abstractmethod
    def _shutdown(self, wait: bool, cancel_futures: bool) -> None:
        """Stop accepting calls; drop queued calls (`call.drop()`) if
        `cancel_futures`; with `wait`, return once all workers have exited.
        Called again on repeated shutdowns: must be idempotent."""

    def _cancel_running(self, call: Call[Any]) -> None:
        """The owner of a running call was cancelled. Default: let it finish."""

    def _capacity(self) -> int | None:
        """How many calls the strategy runs at once (its workers, or its batch
        size); `None` if it has no queue, which makes `max_queue` meaningless."""
        return None

    def _terminate_running(self) -> bool:
        """`aclose(timeout=...)` ran out of time: stop the calls still running if
        the strategy can. Return True if its workers will now exit promptly."""
        return False

    def _set_max_queue(self, max_queue: int | None) -> None:
        """For a strategy's `__init__`: validate and keep `max_queue`."""
        max_queue = check_max_queue(max_queue)
        if max_queue is not None and self._capacity() is None:
            raise ConfigError(f"strategy {self.name!r} has no queue: max_queue does not apply")
        self._max_queue = max_queue

    def _with_batch_form(
        self, fn: Callable[P, T], batch: Callable[..., list[Any]]
    ) -> Callable[P, T]:
        """Attach a batch form to `fn` (see `make_async(batch=...)`). Strategies
        that do not batch ignore it and run `fn` per call."""
        return fn

    # ---- the public interface ---------------------------------------------

    @property
    def closed(self) -> bool:
        """True once `shutdown` has been called."""
        return self._closed

    @property
    def max_queue(self) -> int | None:
        """Calls that may wait for a worker before `Overloaded` (`None`: unbounded)."""
        return self._max_queue

    @property
    def overloaded(self) -> bool:
        """True when a call made now would fail with `Overloaded` (`max_queue`
        calls already wait). A hint for refusing work early (a server answering
        503 before it parses a request), not a reservation: another caller may
        take the last place first."""
        tracker = self._tracker if self._tracker_made else self._make_tracker()
        return tracker is not None and tracker.full

    @contextlib.contextmanager
    def admission(self, function: str) -> Iterator[Admission]:
        """Admission for a unit of work made of several calls (a server request).

        On entry, raises `Overloaded` if a call made now would be refused,
        counting the refusal in `offload_rejected_calls{function=function}`:
        check it before parsing or rendering anything. Once admitted, the unit
        holds one place in flight, as a call would, until the block ends or
        `release()` is called on what the block yields (say, when its calls
        that may queue are done), so a burst of requests that arrive together
        cannot all pass the check before any of them has queued a call. Inside
        the block (this task, and tasks it starts, which copy its
        `contextvars`), calls on this executor are admitted without a further
        check, so an admitted request is never refused halfway.
        """
        tracker = self._tracker if self._tracker_made else self._make_tracker()
        if tracker is None:
            admission = Admission(None)
        else:
            if not tracker.hold():
                tracker.rejected(function, "overloaded")
                raise tracker.overloaded_error()
            admission = Admission(tracker)
        token = _admitted.set(self)
        try:
            yield admission
        finally:
            _admitted.reset(token)
            admission.release()

    def _after_fork_in_child(self) -> None:
        """In a child made by `os.fork()`: the parent's calls in flight are not
        this child's, so they must not count against its `max_queue` (a child
        forked while calls ran would otherwise refuse every call). Strategies
        that forget their workers here call this too."""
        self._tracker = None
        self._tracker_made = False

    def _make_tracker(self) -> CallTracker | None:
        metrics = metrics_enabled()
        if self._max_queue is not None or metrics:
            self._tracker = CallTracker(self.name, self._capacity(), self._max_queue, metrics)
        self._tracker_made = True
        return self._tracker

    def _start(self, call: Call[Any]) -> None:
        tracker = self._tracker if self._tracker_made else self._make_tracker()
        if self._closed:
            if tracker is not None:
                tracker.rejected(function_label(call.fn), "closed")
            raise ExecutorClosed(f"{type(self).__name__} is shut down")
        if tracker is None:
            self._schedule(call)
            return
        tracker.admit(call, _admitted.get() is self)
        try:
            self._schedule(call)
        except BaseException:
            if call.tracker is not None and not call.done:
                tracker.unadmit(call)
            raise

    def start(self) -> None:
        """Start every worker this executor will use, now, and return once each
        has run its initializer. Idempotent: workers already up are kept.

        Blocks the calling thread (from async code: `await
        anyio.to_thread.run_sync(executor.start)`); it is not cancellable.
        Raises `ExecutorClosed` after shutdown. If a worker cannot start (its
        initializer raises, a process cannot be spawned), raises the error its
        first call would get (`OffloadError`, the cause attached); the workers
        that did start stay up, and the executor works as it would without
        `start()`. Strategies without workers (`inline`) have nothing to do.
        Thread-safe, but a `start()` that finds every worker already started
        (by a concurrent `start()`, or by calls) returns without waiting for
        their initializers; a worker that failed to start is retried by its
        next call, not by a second `start()`.
        """
        if self._closed:
            raise ExecutorClosed(f"{type(self).__name__} is shut down")

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `fn(*args, **kwargs)` under this strategy and return its result.

        Raises whatever `fn` raises; `ExecutorClosed` after shutdown;
        `Overloaded` at once when `max_queue` calls already wait. See the class
        docstring for cancellation semantics.
        """
        # An already-cancelled caller must not start a call (as anyio.to_thread).
        await checkpoint_if_cancelled()
        call: Call[T] = Call(fn, args, kwargs, contextvars.copy_context())
        return await self._run_call(call, None)

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
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout)
        ):
            raise ConfigError(f"timeout must be a number of seconds or None, got {timeout!r}")
        await checkpoint_if_cancelled()
        call: Call[T] = Call(fn, args, kwargs, contextvars.copy_context())
        return await self._run_call(call, timeout)

    async def _run_call(self, call: Call[T], timeout: float | None) -> T:  # noqa: ASYNC109
        waiter = current_waiter()
        call.on_done = waiter.wake
        if timeout is not None:
            call.deadline = call.queued_at + timeout
        self._start(call)
        if not call.done:
            try:
                if timeout is None:
                    await waiter.wait()
                else:
                    with anyio.move_on_after(max(0.0, call.deadline - time.perf_counter())):  # type: ignore[operator]
                        await waiter.wait()
            except BaseException:
                if not call.cancel() and not call.done:
                    self._cancel_running(call)
                raise
            if not call.done:  # the deadline passed
                if not call.cancel(DEADLINE) and not call.done:
                    self._cancel_running(call)
                raise TimeoutError(
                    f"offloaded call {getattr(call.fn, '__qualname__', call.fn)!r} did not finish "
                    f"within its timeout of {timeout}s"
                )
        if call.state == CANCELLED:
            error = call.error
            if error is not None:  # a worker found its deadline passed
                raise error
            raise ExecutorClosed(f"{type(self).__name__} was shut down before this call started")
        return call.outcome()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> concurrent.futures.Future[T]:
        """Schedule `fn(*args, **kwargs)` and return a `concurrent.futures.Future`.

        Cancelling the future before the call starts prevents it from running.
        """
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        call: Call[T] = Call(fn, args, kwargs, contextvars.copy_context())
        call.on_claim = future.set_running_or_notify_cancel

        def settle() -> None:
            if call.state == CANCELLED:
                # Withdrawn before any worker claimed it (a claim tells the
                # future itself). `concurrent.futures.wait`/`as_completed`
                # count a cancelled future as done only once it is notified.
                error = call.error
                if error is None:
                    future.cancel()
                if future.set_running_or_notify_cancel() and error is not None:
                    future.set_exception(error)  # its deadline passed
                return
            try:
                result = call.outcome()
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

        call.on_done = settle
        self._start(call)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop the executor. See the class docstring. Idempotent."""
        self._closed = True
        self._shutdown(wait, cancel_futures)

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
        """
        self._closed = True
        if timeout is None:
            await anyio.to_thread.run_sync(self.shutdown)
            return
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
            raise ConfigError(f"timeout must be a number of seconds >= 0 or None, got {timeout!r}")
        self._shutdown(False, True)
        with anyio.move_on_after(timeout):
            await anyio.to_thread.run_sync(self.shutdown, abandon_on_cancel=True)
            return
        if self._terminate_running():
            await anyio.to_thread.run_sync(self.shutdown)

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
        return f"<{type(self).__name__} strategy={self.name!r} {state}>"
