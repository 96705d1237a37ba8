"""`SlotWorker`: the per-slot part of a strategy built on `Dispatcher`;
`ExpressSlotWorker`, one that can also make the express slot;
`ThreadSlotWorker`, one whose slot threads are the workers; and
`run_on_each_worker`, for slots that share one pool."""

from __future__ import annotations

import concurrent.futures
import functools
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ._call import Call
from ._checks import check_initializer
from ._errors import OffloadError
from ._initializer_state import run_initializer

S = TypeVar("S")
T = TypeVar("T")


class SlotWorker(Protocol[S]):
    """The per-slot part of a strategy built on `Dispatcher` (`S`: whatever it
    keeps per slot). Every method but `new_slot` runs on the slot's own thread."""

    def new_slot(self, number: int) -> S:
        """State for a new slot (nothing started yet). Called with the
        dispatcher's lock held, on whichever thread starts the slot; a slot
        whose thread then cannot start is dropped with no other call."""

    def start_worker(self, slot: S) -> None:
        """Start the slot's worker and wait until it is ready (its initializer
        ran). Raise the error its calls should see if it cannot start (an
        `OffloadError` naming the cause, say `initializer_failed(...)`).

        Called first thing on the slot's thread, and again (there) before a
        call when `worker_ready` is False. One slot's methods never overlap,
        but different slots' do: `start_all()` starts every slot at once, so
        `start_worker` runs on several slot threads concurrently, and
        anything slots share (one pool, a counter) needs a lock."""

    def worker_ready(self, slot: S) -> bool:
        """Whether the slot's worker can take a call now (False: started never,
        failed to start, or died: `start_worker` is called first)."""

    def run(self, slot: S, call: Call[Any]) -> None:
        """Run a claimed call on the slot's worker; it must end the call."""

    def stop_worker(self, slot: S) -> None:
        """The slot is exiting (shutdown): stop its worker, if any.

        Called exactly once per slot whose thread ran (whose `start_worker`
        was called), as its thread ends, also when `start_worker` raised
        (release what a failed start left) and also after
        `shutdown(wait=False)`: a slot exits once the calls ahead of it are
        done, whether or not anyone waits for it. So a resource every slot
        shares is released by the `stop_worker` that leaves no slot using it
        (count the slots in `start_worker`, under a lock), not by a
        `shutdown(wait=False)`, which returns while calls still run on it; a
        slot started after that (a call queued at shutdown) takes it again.
        The contract suite checks that the workers exit after either shutdown."""


class ExpressSlotWorker(SlotWorker[S], Protocol[S]):
    """A `SlotWorker` that can also make the express slot (see `Dispatcher`'s
    `express_cost`): a `Dispatcher` with an express slot needs one."""

    def new_express_slot(self, number: int) -> S:
        """State for the express slot, which runs only cheap calls: its worker
        should run at the event loop's priority (the calls it runs are the
        latency-sensitive ones), not lowered as the other workers are. Its
        slot thread already runs at the priority of the thread that built the
        dispatcher (the loop's, as a rule)."""


_UNSTARTED: Any = object()


class ThreadSlot:
    """A slot of a `ThreadSlotWorker`: its thread is its worker."""

    __slots__ = ("express", "number", "prepared", "state")

    def __init__(self, number: int, *, express: bool = False) -> None:
        #: The dispatcher's number for it (0, 1, ...).
        self.number = number
        #: The express slot (cheap calls only; see `ExpressSlotWorker`).
        self.express = express
        #: Whether `prepare_thread` ran on its thread.
        self.prepared = False
        #: Its `worker_state()`, once its initializer ran.
        self.state: Any = _UNSTARTED


class ThreadSlotWorker:
    """A `SlotWorker` (and `ExpressSlotWorker`) whose slot threads are the
    workers: each runs `initializer(*initargs)` once, on its own thread (and
    again before its next call if it raised), then its calls with what it
    returned as `worker_state()`. What `thread` is made of; a subclass
    changes what a thread does first with `prepare_thread`."""

    def __init__(self, initializer: Callable[..., Any] | None, initargs: tuple[Any, ...]) -> None:
        check_initializer(initializer, initargs)
        self.initializer = initializer
        self.initargs = initargs

    def prepare_thread(self, slot: ThreadSlot) -> None:
        """Called once on `slot`'s own thread, before its initializer first
        runs: set the thread's priority, pin it to a core. Default: nothing."""

    def new_slot(self, number: int) -> ThreadSlot:
        return ThreadSlot(number)

    def new_express_slot(self, number: int) -> ThreadSlot:
        return ThreadSlot(number, express=True)

    def start_worker(self, slot: ThreadSlot) -> None:
        if not slot.prepared:
            slot.prepared = True
            self.prepare_thread(slot)
        slot.state = run_initializer(self.initializer, self.initargs)

    def worker_ready(self, slot: ThreadSlot) -> bool:
        return slot.state is not _UNSTARTED

    def run(self, slot: ThreadSlot, call: Call[Any]) -> None:
        call.execute(slot.state)

    def stop_worker(self, slot: ThreadSlot) -> None:
        slot.state = _UNSTARTED



def run_on_each_worker(
    pool: concurrent.futures.Executor, workers: int, fn: Callable[[], T], *, timeout: float = 60.0
) -> list[T]:
    """Run `fn()` once on each of `workers` distinct workers of `pool`, at
    once, and return what each returned: for a strategy whose slots share
    one pool, its `start()` (see `Strategy.start`). Each run holds its
    worker until all have begun, so that a pool which starts a worker only
    when none is idle (`ThreadPoolExecutor`, and `ProcessPoolExecutor` but
    with the "fork" start method) starts `workers` of them. Its workers may
    be threads or processes of this machine (`fn` must then pickle).

    Raises the first error `fn` raised, or `OffloadError` if `pool` did not
    run `workers` at once within `timeout` seconds (it has fewer workers).
    """
    # The runs meet in a folder (one file each): a place threads and
    # processes alike can see.
    with tempfile.TemporaryDirectory(prefix="offload-warm-") as folder:
        hold = functools.partial(_held_until_all_began, fn, folder, workers, timeout)
        outcomes = [future.result() for future in [pool.submit(hold) for _ in range(workers)]]
    if not all(together for _, together in outcomes):
        raise OffloadError(f"{pool!r} did not run {workers} calls at once within {timeout} s")
    return [result for result, _ in outcomes]


def _held_until_all_began(fn: Callable[[], T], folder: str, workers: int, timeout: float) -> tuple[T, bool]:
    fd, _ = tempfile.mkstemp(dir=folder)
    os.close(fd)
    deadline = time.monotonic() + timeout
    try:
        result = fn()
    finally:  # held even if `fn` raised: the other runs need this worker busy
        while (began := len(os.listdir(folder))) < workers and time.monotonic() < deadline:
            time.sleep(0.002)
    return result, began >= workers
