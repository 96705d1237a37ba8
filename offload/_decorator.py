"""`make_async`: turn a blocking function into an `async def` run by a strategy."""

from __future__ import annotations

import atexit
import functools
import inspect
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, overload

from typing_extensions import ParamSpec

from ._checks import check_cost
from ._errors import ConfigError
from ._executor import Executor
from ._fork import reset_in_child
from ._registry import build, resolve

T = TypeVar("T")
P = ParamSpec("P")

AsyncCallable = Callable[P, Coroutine[Any, Any, T]]

# Executors built by `make_async(strategy=..., **options)`, shared by every
# function decorated with the same strategy and options: a server with fifty
# decorated helpers should have one pool, not fifty (like run_in_executor(None)).
_shared: dict[tuple[Any, ...], Executor] = {}
_shared_lock = threading.Lock()


@reset_in_child
def _fresh_shared_lock() -> None:
    # A thread of the parent may have held it at the fork; none holds it here.
    global _shared_lock
    _shared_lock = threading.Lock()


def _shared_executor(strategy: str | None, options: dict[str, Any]) -> Callable[[], Executor]:
    """Validate the strategy and options now; return what gives the current
    shared executor for them (a fresh one once the last was shut down)."""
    cls, resolved = resolve(strategy, options)
    try:
        key: tuple[Any, ...] = (cls, tuple(sorted(resolved.items())))
        hash(key)
    except TypeError:  # unhashable option values: this function gets its own executor
        own: list[Executor] = []

        def private() -> Executor:
            with _shared_lock:
                if not own or own[0].closed:
                    own[:] = [build(cls, resolved)]
                return own[0]

        return private

    def shared() -> Executor:
        with _shared_lock:
            executor = _shared.get(key)
            if executor is None or executor.closed:
                executor = _shared[key] = build(cls, resolved)
            return executor

    return shared


def shutdown_shared_executors(wait: bool = True) -> None:
    """Shut down the executors that `make_async(strategy=...)` created and shares.

    Runs at interpreter exit (without waiting). A decorated function whose
    executor was shut down (here, or through any function's `wrapped.executor`)
    gets the current shared executor, a fresh one if need be, on its next call.
    """
    with _shared_lock:
        executors = list(_shared.values())
        _shared.clear()
    for executor in executors:
        executor.shutdown(wait=wait)


atexit.register(shutdown_shared_executors, wait=False)


def _check_batchable(fn: Callable[..., Any]) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        raise ConfigError(f"cannot read the signature of {fn!r} to check it can be batched") from None
    positional = [
        p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    varargs = [p for p in signature.parameters.values() if p.kind is p.VAR_POSITIONAL]
    if len(positional) != 1 or varargs:
        raise ConfigError(
            f"batch= needs a function of exactly one positional argument (the item); "
            f"{getattr(fn, '__qualname__', fn)!r}{signature} has "
            f"{len(positional)} required positional parameter(s)"
            + (" and *args" if varargs else "")
        )


class _Binding:
    """A decorated function's current shared executor and what it runs there
    (`fn`, or its batch form for that executor)."""

    __slots__ = ("batch", "executor", "fn", "target")

    def __init__(
        self, fn: Callable[..., Any], batch: Callable[..., list[Any]] | None, executor: Executor
    ) -> None:
        self.fn = fn
        self.batch = batch
        self.rebind(executor)

    def rebind(self, executor: Executor) -> tuple[Executor, Callable[..., Any]]:
        self.executor = executor
        batch = self.batch
        self.target = self.fn if batch is None else executor.strategy.batch_form(self.fn, batch)
        return executor, self.target


def _caller(
    func: Callable[P, T],
    bound: Callable[[], tuple[Executor, Callable[..., Any]]],
    timeout: float | None,
    cost: float | Callable[..., float] | None,
    lane: str | None,
) -> AsyncCallable[P, T]:
    """The `async def` that runs `func` on `bound()`'s executor, with the options."""
    if cost is None and lane is None:
        if timeout is None:

            @functools.wraps(func)
            async def plain(*args: P.args, **kwargs: P.kwargs) -> T:
                runner, target = bound()
                return await runner.run(target, *args, **kwargs)

            return plain

        @functools.wraps(func)
        async def timed(*args: P.args, **kwargs: P.kwargs) -> T:
            runner, target = bound()
            return await runner.run_with_timeout(timeout, target, *args, **kwargs)

        return timed

    @functools.wraps(func)
    async def scheduled(*args: P.args, **kwargs: P.kwargs) -> T:
        runner, target = bound()
        each = 1.0 if cost is None else cost(*args, **kwargs) if callable(cost) else cost
        options = runner.options(cost=each, lane=lane)
        if timeout is None:
            return await options.run(target, *args, **kwargs)
        return await options.run_with_timeout(timeout, target, *args, **kwargs)

    return scheduled


@overload
def make_async(fn: Callable[P, T], /) -> AsyncCallable[P, T]: ...


@overload
def make_async(
    fn: Callable[P, T],
    /,
    *,
    strategy: str | None = None,
    executor: Executor | None = None,
    batch: Callable[..., list[Any]] | None = None,
    timeout: float | None = None,
    cost: float | Callable[P, float] | None = None,
    lane: str | None = None,
    **options: Any,
) -> AsyncCallable[P, T]: ...


@overload
def make_async(
    *,
    strategy: str | None = None,
    executor: Executor | None = None,
    batch: Callable[..., list[Any]] | None = None,
    timeout: float | None = None,
    cost: float | Callable[..., float] | None = None,
    lane: str | None = None,
    **options: Any,
) -> Callable[[Callable[P, T]], AsyncCallable[P, T]]: ...


def make_async(
    fn: Callable[P, T] | None = None,
    /,
    *,
    strategy: str | None = None,
    executor: Executor | None = None,
    batch: Callable[..., list[Any]] | None = None,
    timeout: float | None = None,
    cost: float | Callable[..., float] | None = None,
    lane: str | None = None,
    **options: Any,
) -> AsyncCallable[P, T] | Callable[[Callable[P, T]], AsyncCallable[P, T]]:
    """Make `fn` awaitable: `await wrapped(*args, **kwargs)` runs `fn` under a strategy.

    Use it bare (`@make_async`), with options (`@make_async(strategy="thread",
    max_workers=4)`) or as a call (`make_async(fn, strategy="process")`). The
    result is an `async def` function with `fn`'s parameters and return type.

    Args:
        strategy: a name from `offload.STRATEGIES`. `None`: `OFFLOAD_STRATEGY`, else
            `"thread"`. Read once, here, at decoration.
        executor: an `Executor` to use instead of building one (then give no
            `strategy` or options). You own it: shut it down yourself.
        batch: the batch form of `fn` for the micro-batching strategy:
            `batch([item1, item2, ...], **kwargs) -> [result1, result2, ...]`. `fn`
            must take exactly one positional argument. Other strategies ignore it,
            so a strategy switch never breaks the code.
        timeout: seconds each call may take, queue wait included: past it the
            caller gets `TimeoutError` and a call not yet started never runs
            (`Executor.run_with_timeout`). `None` (default): no deadline.
        cost: each call's cost (`Executor.options`): a number, or a function
            called with the call's arguments that returns one (say,
            `cost=len` for a function of one text). It orders the queue
            fairly and counts against `max_queued_cost`. `None`: 1.
        lane: the lane its calls go to (a name from the executor's `lanes`).
            With `strategy=`/options, pass `lanes=` too. `None`: the default lane.
        **options: the strategy's and the executor's options (`max_workers`,
            `initializer`, `max_queue`, `lanes`, ...).
            Functions decorated with the same strategy and options share one
            executor (`wrapped.executor`), shut down at interpreter exit. If
            it is shut down earlier, each function's next call gets a fresh
            shared one (and `wrapped.executor` names it), so closing it
            through one function never breaks the others.

    Raises:
        ConfigError: at decoration, for an unknown strategy or option, a bad
            value, `executor` together with `strategy`/options, or a `batch` on a
            function that does not take exactly one positional argument.
    """
    if executor is not None:
        if strategy is not None or options:
            raise ConfigError(
                "pass either executor= or strategy=/options to make_async, not both "
                f"(got strategy={strategy!r}, options={sorted(options)})"
            )
        if not isinstance(executor, Executor):
            raise ConfigError(f"executor must be an offload.Executor, got {executor!r}")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0
    ):
        raise ConfigError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
    if batch is not None and not callable(batch):
        raise ConfigError(f"batch must be callable, got {batch!r}")
    if cost is not None and not callable(cost):
        cost = check_cost(cost)

    def decorate(func: Callable[P, T]) -> AsyncCallable[P, T]:
        if not callable(func):
            raise ConfigError(f"make_async needs a callable, got {func!r}")
        if inspect.iscoroutinefunction(func):
            raise ConfigError(f"{func!r} is already a coroutine function; make_async wraps blocking ones")
        if batch is not None:
            _check_batchable(func)
        if executor is not None:
            target = executor.strategy.batch_form(func, batch) if batch is not None else func
            wrapper = _caller(func, lambda: (executor, target), timeout, cost, lane)
            wrapper.executor = executor  # type: ignore[attr-defined]
            executor.options(lane=lane)  # an unknown lane fails here, at decoration
            return wrapper

        current = _shared_executor(strategy, options)
        binding = _Binding(func, batch, current())
        binding.executor.options(lane=lane)

        def bound() -> tuple[Executor, Callable[..., Any]]:
            runner, target = binding.executor, binding.target
            if runner.closed:
                runner, target = binding.rebind(current())
                shared_wrapper.executor = runner  # type: ignore[attr-defined]
            return runner, target

        shared_wrapper = _caller(func, bound, timeout, cost, lane)
        shared_wrapper.executor = binding.executor  # type: ignore[attr-defined]
        return shared_wrapper

    if fn is None:
        return decorate
    return decorate(fn)
