"""What a batching strategy runs together: a function's batch form
(`BatchedFunction`), the key that says which queued calls may share one
batch (`batch_key`), compared exactly, never by a value's own `==`, and
running a batch (`run_batch`)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar, final

from typing_extensions import ParamSpec

from .._admission import count_batch
from .._call import Call
from .._errors import OffloadError
from .._initializer_state import _swap_state

T = TypeVar("T")
P = ParamSpec("P")


@final
class BatchedFunction(Generic[P, T]):
    """A function together with its batch form, as `make_async(fn, batch=...)` builds it
    for the micro-batching strategy.

    Calling it calls `fn` (so it behaves as `fn` anywhere else); the strategy
    recognises it and may run several pending calls as one `batch(...)` call.
    It pickles when `fn` and `batch` do.
    """

    __slots__ = ("__wrapped__", "batch", "fn")

    def __init__(self, fn: Callable[P, T], batch: Callable[..., list[Any]]) -> None:
        self.fn = fn
        self.batch = batch
        # What metrics label it by (`offload_*{function=...}`), as for any wrapper.
        self.__wrapped__ = fn

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.fn(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (BatchedFunction, (self.fn, self.batch))

    def __repr__(self) -> str:
        return f"<BatchedFunction fn={self.fn!r} batch={self.batch!r}>"


@final
class _Same:
    """Stands for a value in a batch key that is equal only to itself: comparing
    it never runs the value's own `==` (a NumPy array's or a tensor's raises,
    or answers with an array)."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(other) is _Same and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)


_PLAIN = (type(None), bool, int, str, bytes)


def _exact(value: object) -> Hashable:
    """A key for `value` that equals another's only when the batch form may take
    either for the other: same types all the way down, and no user `==`.

    A frozen dataclass instance (vLLM's `TokenizeParams`, built anew for every
    request) is keyed by its type and its fields' values, each keyed so in turn,
    when its fields are all it holds (nothing else in its `__dict__`, no
    `__slots__` of its own): its `__eq__` is never called."""
    kind = type(value)
    if kind in _PLAIN:
        return (kind, value)
    if kind is float:
        return (float, value.hex())  # type: ignore[attr-defined]  # -0.0 is not 0.0; nan is nan
    if kind is tuple:
        return (tuple, tuple(_exact(item) for item in value))  # type: ignore[attr-defined]
    params = getattr(kind, "__dataclass_params__", None)
    if params is not None and getattr(params, "frozen", False) is True:
        import dataclasses

        names = tuple(f.name for f in dataclasses.fields(value))  # type: ignore[arg-type]
        state = getattr(value, "__dict__", None)
        # Anything besides the fields (a cached property's value, an attribute set
        # with object.__setattr__, slots) could tell two equal-looking ones apart.
        if type(state) is dict and tuple(state) == names and "__slots__" not in kind.__dict__:
            return (_Same(kind), tuple((name, _exact(state[name])) for name in names))
    return _Same(value)


def batch_key(call: Call[Any]) -> Hashable | None:
    """What a call must share with others to join their batch, or None if it runs alone.

    Only a `BatchedFunction` called with exactly one positional argument can be
    batched, and only with calls of the same function and batch form and the
    same keyword arguments: `None`, `bool`, `int`, `float`, `str`, `bytes` and
    tuples of them by type and value, all the way down (`(True,)` never joins
    `(1,)`); a frozen dataclass instance by its type and its fields, keyed so in
    turn (so calls of concurrent requests with equal parameter objects share a
    batch); anything else (an array, a tensor, a list) only if it is the very
    same object. No value's own `==` is ever called, so no key can fail.
    """
    fn = call.fn
    if type(fn) is not BatchedFunction or len(call.args) != 1:
        return None
    try:
        # Keyword names are unique, so sorting never compares the values.
        kwargs = tuple((name, _exact(value)) for name, value in sorted(call.kwargs.items()))
    except RecursionError:  # absurdly deep tuples: run alone
        return None
    return (_Same(fn.fn), _Same(fn.batch), kwargs)


def run_batch(group: list[Call[Any]], state: Any) -> None:
    """Run `group` (calls that may share a batch, the first deciding its
    function and keyword arguments) with `state` as `worker_state()`: as
    one `batch(...)` call, a call alone, or, if the batch form raises, each
    call on its own (see `BatchingStrategy`)."""
    # Claiming here, right before the start, is what keeps a call cancelled
    # while it sat in the batch from running.
    claimed = [call for call in group if call.claim()]
    count_batch(claimed)
    if len(claimed) == 1:
        claimed[0].execute(state)
    elif claimed:
        _run_together(claimed, state)


def _run_together(claimed: list[Call[Any]], state: Any) -> None:
    first = claimed[0]
    form: BatchedFunction[..., Any] = first.fn  # type: ignore[assignment]
    items = [call.args[0] for call in claimed]
    previous = _swap_state(state)
    try:
        if first.context is None:
            results = form.batch(items, **first.kwargs)
        else:
            results = first.context.run(form.batch, items, **first.kwargs)
    except Exception:
        failed = True
    except BaseException as exc:  # KeyboardInterrupt, SystemExit: not an item's fault
        for call in claimed:
            call.set_exception(exc)
        return
    else:
        failed = False
    finally:
        _swap_state(previous)
        del items
    if failed:
        # Find the bad item(s): each call alone, with its own exception and frames.
        for call in claimed:
            call.execute(state)
        return
    if not isinstance(results, (list, tuple)) or len(results) != len(claimed):
        shape = f"{type(results).__name__}" + (
            f" of {len(results)}" if isinstance(results, (list, tuple)) else ""
        )
        for call in claimed:
            call.set_exception(
                OffloadError(
                    f"batch form {form.batch!r} returned a {shape} for {len(claimed)} "
                    "items; it must return a list with one result per item, in order"
                )
            )
        return
    for call, result in zip(claimed, results, strict=True):
        call.set_result(result)
