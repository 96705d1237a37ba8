"""Moving a call to another process and its outcome back: functions by
reference, exceptions with their traceback (public in `offload.strategy`)."""

from __future__ import annotations

import pickle
import sys
import traceback
from collections.abc import Callable
from functools import partial
from typing import Any, final

# Makes tracebacks picklable, so the caller sees the function's own frames.
# Imported with the module, not when an error is described: a worker out of
# file descriptors could not import it then, and would die instead of
# reporting the error.
from tblib import pickling_support

from ._errors import OffloadError

#: What `portable_error` checks an exception with by default: what the
#: `process` strategy sends it with.
_DUMPS: Callable[[Any], bytes] = partial(pickle.dumps, protocol=5)


@final
class _Wrapped:
    """Stands for a function that is reachable by name only through the
    decorator that replaced it (`@make_async` puts an async wrapper under the
    function's name, so pickle's by-name lookup finds the wrapper)."""

    __slots__ = ("module", "qualname")

    def __init__(self, module: str, qualname: str) -> None:
        self.module = module
        self.qualname = qualname

    def __reduce__(self) -> tuple[Any, ...]:
        return _unwrap, (self.module, self.qualname)


def _lookup(module: str, qualname: str) -> Any:
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj


def _unwrap(module: str, qualname: str) -> Any:
    __import__(module)
    return _lookup(module, qualname).__wrapped__


def by_reference(fn: Any) -> Any:
    """What to pickle in place of `fn` (a `Call`'s `fn`) to send it to another process.

    Pickle sends a function by name (module and qualified name), and
    `make_async` (like any decorator) puts its wrapper under the function's
    name: the name then finds the wrapper, and pickling `fn` fails. For such a
    function this returns a small stand-in that unpickles, in the other
    process, as the original function (the wrapper's `__wrapped__`); for any
    other `fn`, `fn` itself. The other process must be able to import `fn`'s
    module, as for any function pickle sends by name.
    """
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qualname or "<locals>" in qualname:
        return fn
    named = _lookup(module, qualname)
    if named is not fn and getattr(named, "__wrapped__", None) is fn:
        return _Wrapped(module, qualname)
    return fn


def describe_error(
    exc: BaseException, dumps: Callable[[Any], bytes] = _DUMPS
) -> tuple[BaseException | None, str]:
    """`exc`, made to pickle (with `dumps`) with its traceback where it can
    (`None` if it cannot be pickled at all), and its formatted traceback text."""
    text = "".join(traceback.format_exception(exc))
    # Per instance: the class (and those of its cause and context) may have
    # been defined after the worker started, so a blanket install misses it.
    pickling_support.install(exc)
    if _round_trips(exc, dumps):
        return exc, text
    # Pickling a traceback recurses once per frame: past a few hundred frames
    # (always for a RecursionError) it fails. The type and message matter more
    # than the frames, which the parent gets as text.
    for link in _chain(exc):
        link.__traceback__ = None
    if _round_trips(exc, dumps):
        return exc, text
    return None, text  # the parent rebuilds it from the text


def portable_error(exc: BaseException, *, dumps: Callable[[Any], bytes] = _DUMPS) -> BaseException:
    """An exception to pickle in a worker process and raise in the caller's.

    Call it in the worker on what the offloaded function raised, send the
    result back, and pass it to `call.set_exception`. It is `exc` itself,
    made picklable with its traceback (tblib), so the caller gets the same
    type, message and the function's own frames; if the traceback cannot be
    pickled (too deep: a `RecursionError`), `exc` with its frames as a note
    (Python 3.11+); if `exc` cannot be pickled at all, an `OffloadError`
    whose message holds its formatted traceback.

    `dumps` is what the worker will send it with, which decides what
    "can be pickled" means: default `pickle.dumps`; a strategy whose
    transport pickles classes by value (cloudpickle, as Ray does: an
    exception class defined in the caller's `__main__`) passes its own.
    """
    return rebuild_error(describe_error(exc, dumps))


def rebuild_error(payload: tuple[BaseException | None, str]) -> BaseException:
    """The exception to raise for what `describe_error` gave."""
    exception, text = payload
    if exception is not None:
        if exception.__traceback__ is None and text and hasattr(exception, "add_note"):
            # It came without its frames (too deep to pickle): keep them as text.
            exception.add_note(f"traceback in the worker process:\n{text}")
        return exception
    return OffloadError(
        "the offloaded function raised an exception that cannot be pickled; "
        f"its traceback in the worker:\n{text}"
    )


def _round_trips(exc: BaseException, dumps: Callable[[Any], bytes]) -> bool:
    try:
        pickle.loads(dumps(exc))
    except Exception:
        return False
    return True


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and every exception it links to (cause, context), each once."""
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        link = todo.pop()
        if link is None or any(link is s for s in seen):
            continue
        seen.append(link)
        todo += (link.__cause__, link.__context__)
    return seen
