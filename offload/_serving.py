"""`serve`: one worker's life, from its start to its last call, under the one
rule for a worker that fails to start (every worker thread of `Dispatcher`
and of `async-renderer` runs it)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from ._startup import Startup

W = TypeVar("W")


def serve(
    work: Iterable[W],
    *,
    start: Callable[[], None],
    ready: Callable[[], bool],
    run: Callable[[W], None],
    fail: Callable[[W, BaseException], None],
    startup: Startup | None,
) -> None:
    """Start a worker (`start()`), then `run` each piece of `work` on it.

    The start-up rule (`Strategy.start`): if `start()` raises, the error goes
    to `startup` (`start()`'s caller) when there is one, else to the first
    piece of work (`fail(piece, error)`), and no piece of work ever sees it
    twice. Before each later piece, a worker that is not `ready()` is started
    again; if that raises, that piece alone fails with the error, and the
    next piece tries again.
    """
    error = _attempt(start)
    if startup is not None:
        startup.finished(error)
        error = None  # start()'s caller has it: no call sees it
    for piece in work:
        if error is None and not ready():
            error = _attempt(start)
        if error is None:
            run(piece)
        else:
            fail(piece, error)
            error = None
        del piece  # don't keep the last call's arguments alive while idle


def _attempt(start: Callable[[], None]) -> BaseException | None:
    try:
        start()
    except BaseException as exc:
        return exc
    return None
