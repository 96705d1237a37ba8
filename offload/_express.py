"""The express slot: one more slot of a `Dispatcher` that takes only cheap calls.

With `express_cost` above 0, a dispatcher has, beside its `max_slots`
slots, one that takes only calls that are cheap beside the work in
progress: priced at most `express_cost`, and at most 1/`EXPRESS_RATIO` of
the costliest call running on the other slots. A cheap call then does not
wait for a worker to finish a far longer call it already started, which
lanes cannot prevent: calls are not interrupted. Calls of similar sizes (a
flood of pieces of one size) never use it, so it does not become one more
worker for the flood. It takes them in the queue's fair order, never out of
their flow's order (`CallQueue.take`), and is woken by a token of its own,
only for such calls.

It starts with its dispatcher's first slot (so that its thread is made by
the thread that makes the first call, the event loop's as a rule, not by a
worker running at a lowered priority), and its thread sets its niceness to
that of the thread that built the dispatcher: the loop's priority, whatever
the priority of the thread that started it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator
from functools import partial
from typing import Any, Generic, TypeVar, cast, final

from ._call import Call
from ._errors import OffloadError
from ._niceness import set_this_thread_niceness, this_thread_niceness
from ._queue import CallQueue
from ._slot_worker import ExpressSlotWorker, SlotWorker

S = TypeVar("S")

#: The express slot takes a call only while a call at least this many times
#: its cost runs on another slot: what it spares a cheap call is a wait
#: several times its own run, and calls of similar sizes share the others.
#: Why: docs/decisions/0003-express-worker-one-piece-and-a-quarter.md
EXPRESS_RATIO = 4.0


def _costs_at_most(limit: float, call: Call[Any]) -> bool:
    return call.cost <= limit


@final
class ExpressSlot(Generic[S]):
    """A dispatcher's express slot: which calls it may take, waking it, its
    loop. Its state is guarded by the dispatcher's lock, which the methods
    marked so expect held."""

    #: Its thread's name, after the dispatcher's prefix.
    name = "express"

    def __init__(
        self,
        owner: str,
        cost: float,
        worker: SlotWorker[S],
        lock: threading.Lock,
        calls: CallQueue,
        running: dict[S, Call[Any]],
    ) -> None:
        if not callable(getattr(worker, "new_express_slot", None)):
            raise OffloadError(f"{owner}: its slots have no express slot (new_express_slot)")
        #: It takes calls priced at most this (and 1/`EXPRESS_RATIO` of the costliest running).
        self.cost = cost
        self._worker = cast("ExpressSlotWorker[S]", worker)
        self._lock = lock
        self._calls = calls
        self._running = running
        #: The slot, once its thread started (`None` before, and after it exited).
        self.slot: S | None = None
        # Wakes it for a cheap call (None: exit). It holds at most one True:
        # one is put only while the slot waits with none.
        self._tokens: queue.SimpleQueue[bool | None] = queue.SimpleQueue()
        self._waiting = False
        # The loop's priority: the niceness of the thread that built its dispatcher.
        self._niceness = this_thread_niceness()

    def new_slot(self, number: int) -> S:
        return self._worker.new_express_slot(number)

    def limit(self) -> float:
        """With the lock held: the costliest call it may take now."""
        largest = max((call.cost for slot, call in self._running.items() if slot is not self.slot), default=0.0)
        return min(self.cost, largest / EXPRESS_RATIO)

    def offer(self, call: Call[Any], start: Callable[[], None]) -> bool:
        """With the lock held, for `call`, just queued: whether this slot
        will look at the queue for it. If `call` is one it may take now, it
        is woken, or started with `start()` if its thread is not running
        (`RuntimeError`, no thread left: the regular slots serve it)."""
        if call.cost > self.limit():
            return False
        if self.slot is None:
            try:
                start()
            except RuntimeError:
                return False
            return True
        if self._waiting:
            self._waiting = False
            self._tokens.put(True)
            return True
        return False  # busy: it looks again when its call is done

    def take_calls(self, slot: S) -> Generator[Call[Any], None, None]:
        """Its loop, on its own thread: the cheap calls it takes, in the
        queue's fair order, until told to exit. It takes no token of the
        dispatcher's for a call: the call's token stays queued and wakes a
        regular slot, which finds the next call, or none (tokens never fall
        below the calls queued)."""
        set_this_thread_niceness(self._niceness)
        get = self._tokens.get
        while True:
            with self._lock:
                taken = self._calls.take(partial(_costs_at_most, self.limit()), 1)
                if taken:
                    self._running[slot] = taken[0]
                else:
                    self._waiting = True
            if not taken:
                if get() is None:
                    return
                continue
            call = taken[0]
            if call.claim():
                yield call
            with self._lock:
                self._running.pop(slot, None)
            del call, taken  # don't keep the last call's arguments alive while idle

    def exited(self) -> None:
        """With the lock held: its slot exited (at shutdown, or after a bug:
        the regular slots serve what is queued, and a later call starts a new one)."""
        self.slot, self._waiting = None, False

    def close(self) -> None:
        """With the lock held: tell its slot, if any, to exit."""
        if self.slot is not None:
            self._tokens.put(None)
