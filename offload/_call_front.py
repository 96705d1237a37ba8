"""A call's outcome as its caller waits for it: started, awaited (with a
deadline) or handed back as a `concurrent.futures.Future`, cancelled.

What every executor does between admitting a call (`Executor._start`) and
giving its caller the outcome, whatever the strategy.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import time
from collections.abc import Callable
from typing import Any, TypeVar, final

import anyio
from typing_extensions import ParamSpec

from ._call import CANCELLED, DEADLINE, Call
from ._checks import check_timeout
from ._errors import ExecutorClosed
from ._lanes import Lane
from ._strategy import Strategy
from ._waiter import checkpoint_if_cancelled, current_waiter

T = TypeVar("T")
P = ParamSpec("P")


async def run_call(
    call: Call[T],
    timeout: float | None,  # noqa: ASYNC109 (stamped on the call: see Executor.run_with_timeout)
    start: Callable[[Call[Any]], None],
    strategy: Strategy,
) -> T:
    """Start `call` with `start` and wait for its outcome.

    A cancelled caller withdraws a queued call, or has the strategy stop a
    running one (`cancel_running`); a deadline `timeout` seconds away does
    the same and raises `TimeoutError`."""
    waiter = current_waiter()
    call.on_done = waiter.wake
    if timeout is not None:
        call.deadline = call.queued_at + timeout
    start(call)
    if not call.done:
        try:
            if timeout is None:
                await waiter.wait()
            else:
                with anyio.move_on_after(max(0.0, call.deadline - time.perf_counter())):  # type: ignore[operator]
                    await waiter.wait()
        except BaseException:
            if not call.cancel() and not call.done:
                strategy.cancel_running(call, CANCELLED)
            raise
        if not call.done:  # the deadline passed
            if not call.cancel(DEADLINE) and not call.done:
                strategy.cancel_running(call, DEADLINE)
            raise TimeoutError(
                f"offloaded call {getattr(call.fn, '__qualname__', call.fn)!r} did not finish "
                f"within its timeout of {timeout}s"
            )
    if call.state == CANCELLED:
        error = call.error
        if error is not None:  # a worker found its deadline passed
            raise error
        raise ExecutorClosed(f"the {strategy.name} executor was shut down before this call started")
    return call.outcome()


def submit_call(call: Call[T], start: Callable[[Call[Any]], None]) -> concurrent.futures.Future[T]:
    """Start `call` with `start`; its outcome arrives in the returned future,
    and cancelling the future before the call starts withdraws the call."""
    future: concurrent.futures.Future[T] = concurrent.futures.Future()
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

    def withdraw_if_cancelled(done: concurrent.futures.Future[T]) -> None:
        # `future.cancel()` by its holder (`run_in_executor`'s task was
        # cancelled, say): the call must not keep its place while it waits.
        if done.cancelled() and call.cancel():
            # `wait`/`as_completed` count a cancelled future only once notified.
            done.set_running_or_notify_cancel()

    call.on_done = settle
    start(call)
    future.add_done_callback(withdraw_if_cancelled)
    return future


@final
class CallOptions:
    """`Executor.options(...)`: the executor's `run`, `run_with_timeout` and
    `submit` with a cost and a lane for each call made through it."""

    __slots__ = ("_cost", "_lane", "_start", "_strategy")

    def __init__(
        self, start: Callable[[Call[Any]], None], strategy: Strategy, cost: float, lane: Lane
    ) -> None:
        self._start = start
        self._strategy = strategy
        self._cost = cost
        self._lane = lane

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """`Executor.run` with these options."""
        # An already-cancelled caller must not start a call (as anyio.to_thread).
        await checkpoint_if_cancelled()
        return await run_call(self._call(fn, args, kwargs), None, self._start, self._strategy)

    async def run_with_timeout(
        self,
        timeout: float | None,  # noqa: ASYNC109 (see Executor.run_with_timeout)
        fn: Callable[P, T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """`Executor.run_with_timeout` with these options."""
        check_timeout(timeout, allow_zero=True)
        await checkpoint_if_cancelled()
        return await run_call(self._call(fn, args, kwargs), timeout, self._start, self._strategy)

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> concurrent.futures.Future[T]:
        """`Executor.submit` with these options."""
        return submit_call(self._call(fn, args, kwargs), self._start)

    def _call(self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call[T]:
        call: Call[T] = Call(fn, args, kwargs, contextvars.copy_context())
        call.cost = self._cost
        call.lane = self._lane
        return call
