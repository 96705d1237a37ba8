"""`SlotWorker`: the per-slot part of a strategy built on `Dispatcher`;
`ExpressSlotWorker`, one that can also make the express slot; and
`ThreadSlotWorker`, one whose slot threads are the workers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ._call import Call
from ._checks import check_initializer
from ._worker_state import run_initializer

S = TypeVar("S")


class SlotWorker(Protocol[S]):
    """The per-slot part of a strategy built on `Dispatcher` (`S`: whatever it
    keeps per slot). Every method but `new_slot` runs on the slot's own thread."""

    def new_slot(self, number: int) -> S:
        """State for a new slot (nothing started yet)."""

    def start_worker(self, slot: S) -> None:
        """Start the slot's worker and wait until it is ready (its initializer
        ran). Raise the error its calls should see if it cannot start (an
        `OffloadError` naming the cause, say `initializer_failed(...)`)."""

    def worker_ready(self, slot: S) -> bool:
        """Whether the slot's worker can take a call now (False: started never,
        failed to start, or died: `start_worker` is called first)."""

    def run(self, slot: S, call: Call[Any]) -> None:
        """Run a claimed call on the slot's worker; it must end the call."""

    def stop_worker(self, slot: S) -> None:
        """The slot is exiting (shutdown): stop its worker, if any."""


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
