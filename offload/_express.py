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
from collections.abc import Callable, Generator, Iterator
from functools import partial
from typing import Any, Generic, TypeVar, cast, final

from ._call import Call
from ._errors import OffloadError
from ._niceness import set_this_thread_niceness, this_thread_niceness
from ._queue import CallQueue
from ._slot_interface import ExpressSlotWorker, SlotWorker

S = TypeVar("S")

#: The express slot takes a call only while a call at least this many times
#: its cost runs on another slot: what it spares a cheap call is a wait
#: several times its own run, and calls of similar sizes share the others.
#: Why: docs/decisions/0003-express-worker-one-piece-and-a-quarter.md
EXPRESS_RATIO = 4.0


def _costs_at_most(limit: float, call: Call[Any]) -> bool:
    return call.cost <= limit


#: How a dispatcher starts a slot thread: the slot, its thread's name after
#: the dispatcher's prefix, and its loop.
Spawn = Callable[[S, str, Iterator[Call[Any]]], None]


class SideSlot(Generic[S]):
    """A slot beside a dispatcher's regular ones, composed in: the
    dispatcher calls it at these points, each with the dispatcher's lock
    held. This base is none: every point does nothing (a dispatcher without
    an express slot holds one)."""

    #: It takes calls priced at most this; 0: it takes none.
    cost = 0.0

    def offer(self, call: Call[Any], start: Callable[[], object]) -> bool:
        """`call` was just queued: whether this slot will look at the queue
        for it (it may `start()` its thread to do so)."""
        return False

    def start(self, numbers: Iterator[int], spawn: Spawn[S]) -> bool:
        """Start its slot with `spawn`, numbered from `numbers`, if it is not
        running (with the first regular slot, `grow` and `start_all`);
        return whether it did.
        `RuntimeError` from `spawn` (no thread left) goes to the caller."""
        return False

    def live(self) -> int:
        """Slots of its own among the dispatcher's live slots (0 or 1)."""
        return 0

    def exited(self, slot: S) -> bool:
        """`slot` exited: whether it was this one's (then it is forgotten,
        and a later call starts a new one)."""
        return False

    def close(self) -> None:
        """Shutdown began: tell its slot, if any, to exit."""


@final
class ExpressSlot(SideSlot[S]):
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

    def start(self, numbers: Iterator[int], spawn: Spawn[S]) -> bool:
        if self.slot is not None:
            return False
        slot = self._worker.new_express_slot(next(numbers))
        spawn(slot, self.name, self.take_calls(slot))
        self.slot = slot  # it looks at the queue as soon as its thread runs
        return True

    def live(self) -> int:
        return int(self.slot is not None)

    def limit(self) -> float:
        """With the lock held: the costliest call it may take now."""
        largest = max((call.cost for slot, call in self._running.items() if slot is not self.slot), default=0.0)
        return min(self.cost, largest / EXPRESS_RATIO)

    def offer(self, call: Call[Any], start: Callable[[], object]) -> bool:
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

    def exited(self, slot: S) -> bool:
        # At shutdown, or after a bug: the regular slots serve what is queued.
        if slot is not self.slot:
            return False
        self.slot, self._waiting = None, False
        return True

    def close(self) -> None:
        if self.slot is not None:
            self._tokens.put(None)
