"""Per-worker state built by an executor's `initializer`."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ._errors import OffloadError, initializer_failed

_NO_STATE: Any = object()


class _Current(threading.local):
    state: Any = _NO_STATE


_current = _Current()


def worker_state() -> Any:
    """Return the object that the executor's `initializer` returned in this worker.

    Call it from inside an offloaded function. Each worker (a thread, a process,
    the batching strategy's lane, or for `inline` the calling thread) runs the
    initializer once and keeps its own result, so an object that is not
    thread-safe, such as a Hugging Face fast tokenizer, is never used by two
    workers at once.

    Raises:
        OffloadError: called outside an offloaded call, or the executor has no
            `initializer`.
    """
    state = _current.state
    if state is _NO_STATE:
        raise OffloadError(
            "worker_state() is only available inside a call run by an executor "
            "that was given an initializer"
        )
    return state


def _swap_state(state: Any) -> Any:
    """Make `state` this thread's worker state; return the previous one for restoring."""
    previous = _current.state
    _current.state = state
    return previous


def set_worker_state(state: Any) -> Any:
    """Make `state` what `offload.worker_state()` returns on this thread, and
    return what it returned before (pass that back to restore it).

    For a strategy whose workers are not `Call.execute`'s threads: a worker
    process of its own, say. Call it in the worker, on the thread that runs
    calls, with what the executor's `initializer(*initargs)` returned
    (`ProcessPoolExecutor`'s own `initializer` is a good place). Threads that
    run `call.execute(state)` need not: `execute` sets it for the call.
    """
    return _swap_state(state)


def run_initializer(initializer: Callable[..., Any] | None, initargs: tuple[Any, ...]) -> Any:
    """Run a worker's `initializer(*initargs)` on this thread and return its
    state, to pass to `call.execute(state)` (without an initializer, the
    state that makes `worker_state()` raise). For strategy authors.

    Raises `initializer_failed(initializer, error)` if it raises: the error
    the worker's next call, or `start()`'s caller, gets (see `Strategy.start`).
    """
    if initializer is None:
        return _NO_STATE
    try:
        return initializer(*initargs)
    except BaseException as exc:
        raise initializer_failed(initializer, exc) from exc
