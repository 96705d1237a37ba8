"""A worker's start-up rule, once: `serve` (one worker's life, from its start
to its last call; every worker thread of `Dispatcher` and of
`async-renderer` runs it) and `replace_worker` (a dead worker's successor)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

from ._metrics import count_worker_restart
from ._startup import Startup

if TYPE_CHECKING:
    from ._slot_interface import SlotWorker
    from ._strategy import Strategy

S = TypeVar("S")
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


def replace_worker(strategy: Strategy, worker: SlotWorker[S], slot: S, reason: str) -> None:
    """Start the successor of `slot`'s worker, which died, was killed or was
    retired (`reason`: `"crashed"`, `"killed"`, `"retired"`, counted in
    `offload_worker_restarts_total`), now, on the slot's thread, so that the
    pool is back to full strength before the next call needs it. For
    strategy authors; not while the strategy shuts down.

    By the start-up rule (`serve`), a successor that fails to start fails
    nobody now: the slot's next call starts it again and gets the error.
    """
    count_worker_restart(strategy, reason)
    try:
        worker.start_worker(slot)
    except BaseException:  # noqa: S110 (the next call retries and reports it)
        pass
