"""The one strategy interface: `Executor`."""

from __future__ import annotations

import abc
import concurrent.futures
import contextvars
from collections.abc import Callable
from types import TracebackType
from typing import Any, ClassVar, TypeVar

import anyio
import anyio.to_thread
from typing_extensions import ParamSpec, Self

from ._call import CANCELLED, Call
from ._errors import ExecutorClosed
from ._waiter import current_waiter

T = TypeVar("T")
P = ParamSpec("P")


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

    **Shutdown.** `shutdown(wait=True)` (also `with`, `async with`, `aclose()`)
    refuses new calls with `ExecutorClosed`, lets queued calls run (or, with
    `cancel_futures=True`, drops them: their callers get `ExecutorClosed`, their
    futures are cancelled), and with `wait=True` returns once every worker has
    exited. It is idempotent.

    **Thread-safety.** All methods may be called from any thread.

    Writing a strategy: subclass, set `name`, and implement `_schedule` and
    `_shutdown`. Admission, deadlines and metrics belong here, around
    `_schedule`, not in strategies.
    """

    #: The registry name of the strategy (`offload.STRATEGIES`).
    name: ClassVar[str]

    _closed: bool = False

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

    def _start(self, call: Call[Any]) -> None:
        if self._closed:
            raise ExecutorClosed(f"{type(self).__name__} is shut down")
        self._schedule(call)

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `fn(*args, **kwargs)` under this strategy and return its result.

        Raises whatever `fn` raises; `ExecutorClosed` after shutdown. See the
        class docstring for cancellation semantics.
        """
        call: Call[T] = Call(fn, args, kwargs, contextvars.copy_context())
        waiter = current_waiter()
        call.on_done = waiter.wake
        self._start(call)
        if not call.done:
            try:
                await waiter.wait()
            except BaseException:
                if not call.cancel() and not call.done:
                    self._cancel_running(call)
                raise
        if call.state == CANCELLED:
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
                future.cancel()
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

    async def aclose(self) -> None:
        """`shutdown(wait=True)` without blocking the event loop."""
        self._closed = True
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
