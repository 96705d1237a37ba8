"""`make_async`: turn a blocking function into an `async def` run by a strategy."""

from __future__ import annotations

import atexit
import functools
import inspect
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, overload

from typing_extensions import ParamSpec

from ._errors import ConfigError
from ._executor import Executor
from ._registry import resolve

T = TypeVar("T")
P = ParamSpec("P")

AsyncCallable = Callable[P, Coroutine[Any, Any, T]]

# Executors built by `make_async(strategy=..., **options)`, shared by every
# function decorated with the same strategy and options: a server with fifty
# decorated helpers should have one pool, not fifty (like run_in_executor(None)).
_shared: dict[tuple[Any, ...], Executor] = {}
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
                    own[:] = [cls(**resolved)]
                return own[0]

        return private

    def shared() -> Executor:
        with _shared_lock:
            executor = _shared.get(key)
            if executor is None or executor.closed:
                executor = _shared[key] = cls(**resolved)
            return executor

    return shared


def _reset_lock_in_child() -> None:
    # Another thread may have held it at the fork; no thread holds it here.
    global _shared_lock
    _shared_lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # pragma: no branch (every POSIX Python)
    os.register_at_fork(after_in_child=_reset_lock_in_child)


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
        self.target = self.fn if batch is None else executor._with_batch_form(self.fn, batch)
        return executor, self.target


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
    **options: Any,
) -> AsyncCallable[P, T]: ...


@overload
def make_async(
    *,
    strategy: str | None = None,
    executor: Executor | None = None,
    batch: Callable[..., list[Any]] | None = None,
    timeout: float | None = None,
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
        **options: the strategy's options (`max_workers`, `initializer`, ...).
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

    def decorate(func: Callable[P, T]) -> AsyncCallable[P, T]:
        if not callable(func):
            raise ConfigError(f"make_async needs a callable, got {func!r}")
        if inspect.iscoroutinefunction(func):
            raise ConfigError(f"{func!r} is already a coroutine function; make_async wraps blocking ones")
        if batch is not None:
            _check_batchable(func)
        if executor is not None:
            target = executor._with_batch_form(func, batch) if batch is not None else func
            if timeout is None:
                run = executor.run

                @functools.wraps(func)
                async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
                    return await run(target, *args, **kwargs)
            else:
                run_with_timeout = executor.run_with_timeout

                @functools.wraps(func)
                async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
                    return await run_with_timeout(timeout, target, *args, **kwargs)

            wrapper.executor = executor  # type: ignore[attr-defined]
            return wrapper

        current = _shared_executor(strategy, options)
        binding = _Binding(func, batch, current())

        @functools.wraps(func)
        async def shared_wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            runner, target = binding.executor, binding.target
            if runner.closed:
                runner, target = binding.rebind(current())
                shared_wrapper.executor = runner  # type: ignore[attr-defined]
            if timeout is None:
                return await runner.run(target, *args, **kwargs)
            return await runner.run_with_timeout(timeout, target, *args, **kwargs)

        shared_wrapper.executor = binding.executor  # type: ignore[attr-defined]
        return shared_wrapper

    if fn is None:
        return decorate
    return decorate(fn)
