"""`SlotWorker`: the per-slot part of a strategy built on `Dispatcher`, and
`ExpressSlotWorker`, one that can also make the express slot."""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from ._call import Call

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
        slot thread already runs at the loop's priority (see `Dispatcher`)."""
