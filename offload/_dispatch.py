"""`Dispatcher`: a fair queue served by slot threads (public as `offload.strategy.Dispatcher`).

What `thread`, `process` and `ray` share. Calls wait in one `CallQueue`
(fair by lane, flow and cost); up to `max_slots` slots take them. A *slot* is a
thread of this process; its *worker* is what runs the calls: the slot thread
itself (`thread`), a worker process (`process`) or an actor (`ray`). Slots
start on demand, or all at once with `start_all()`, and stay until shutdown.

    schedule(call) ──put──▶ CallQueue ──pop──▶ slot thread ──run(slot, call)──▶ worker
                      │                          ▲
                      └── a token per call ──────┘  (a slot blocks on a C-level queue)

The strategy supplies the per-slot part (`SlotWorker`): make a slot, start
its worker, tell whether it is ready, run one claimed call on it, stop it.
The dispatcher does the rest: claiming, the busy slots, start-up reporting,
retrying a worker that failed to start, shutdown and joining.

**The express slot**: with `express_cost` above 0, one more slot, the
express slot (`_express.py`), that takes only calls that are cheap beside
the work in progress. It is composed in: the dispatcher holds a `SideSlot`
(the express slot, or one that does nothing) and calls it at five points:
`offer` (a call was queued), `start` (with the first slot, `grow` and
`start_all`), `live` (counting the regular slots), `exited` (a slot's
thread ended) and `close`. Which calls it takes, when it is woken and its
loop are its own.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import time
from collections.abc import Generator, Iterator
from functools import partial
from typing import Any, Generic, TypeVar, final

from ._call import Call
from ._errors import OffloadError, executor_closed
from ._express import ExpressSlot, SideSlot
from ._queue import CallQueue
from ._slot_interface import SlotWorker
from ._startup import Startup
from ._worker_lifecycle import serve

S = TypeVar("S")

__all__ = ["Dispatcher"]


@final
class Dispatcher(Generic[S]):
    """A `CallQueue` and up to `max_slots` slot threads that take calls from it. Thread-safe."""

    def __init__(
        self,
        strategy: str,
        max_slots: int,
        worker: SlotWorker[S],
        *,
        thread_name: str | None = None,
        express_cost: float = 0.0,
    ) -> None:
        """`express_cost` above 0 adds the express slot (`ExpressSlot`), beyond
        `max_slots`: it starts with the first slot (or with
        `start_all()`/`grow()`); `worker` must be an `ExpressSlotWorker`. 0
        (default): none."""
        #: For messages: the strategy's name.
        self._owner = strategy
        self._thread_name = thread_name or f"offload-{strategy}"
        self._max_slots = max_slots
        self._worker = worker
        self._calls = CallQueue()
        # One token per queued call, None to stop a slot: slots block in C, not on a Condition.
        self._tokens: queue.SimpleQueue[bool | None] = queue.SimpleQueue()
        self._slots: dict[S, threading.Thread] = {}
        self._running: dict[S, Call[Any]] = {}
        # Slots that will take a token next (started, or done with a call) and
        # have not taken it yet: a call needs a new slot only while its token
        # would find none of them free (`_queued` > `_waiting`).
        self._waiting = 0
        self._queued = 0  # tokens for calls not taken yet (stop tokens not counted)
        self._numbers = itertools.count()
        self._stopping = False
        #: Guards whatever a strategy changes on a slot that another thread
        #: reads (say, the process it kills).
        self.lock = threading.Lock()
        # The express slot, with a rule of its own for the calls it takes (or none).
        self._express: SideSlot[S] = (
            ExpressSlot(strategy, express_cost, worker, self.lock, self._calls, self._running)
            if express_cost > 0
            else SideSlot()
        )

    # ---- state -----------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """True once `close` has begun."""
        return self._stopping

    @property
    def max_slots(self) -> int:
        """Slots besides the express slot."""
        return self._max_slots

    @property
    def express_cost(self) -> float:
        """The express slot takes calls priced at most this (and see
        `ExpressSlot`); 0: there is none."""
        return self._express.cost

    def _regular_slots(self) -> int:
        return len(self._slots) - self._express.live()

    def slots(self) -> list[S]:
        """The live slots (a snapshot)."""
        with self.lock:
            return list(self._slots)

    def running(self) -> list[tuple[S, Call[Any]]]:
        """The busy slots and the call each runs (a snapshot). Hold `lock` to
        act on one without it changing meanwhile."""
        with self.lock:
            return list(self._running.items())

    def slot_running(self, call: Call[Any]) -> S | None:
        """The slot running `call`, if any. Call with `lock` held."""
        for slot, running in self._running.items():
            if running is call:
                return slot
        return None

    # ---- calls -------------------------------------------------------------------

    def put(self, call: Call[Any]) -> None:
        """Queue `call` (and start a slot if none is free). Raises
        `ExecutorClosed` once `close` has begun, and `OffloadError` if no slot
        exists and none can be started (no thread left): then the call was
        not queued.

        A worker that fails to start hands its error to the next call its
        slot takes, which fails with it; a later call starts it again."""
        with self.lock:
            if self._stopping:
                raise executor_closed(self._owner)
            # Queued before a slot starts, so that a new slot finds it at once.
            self._calls.push(call)
            self._queued += 1
            self._tokens.put(True)
            if self._express.offer(call, partial(self._start_express, None)):
                # The express slot takes it, unless a free slot gets there first.
                return
            if self._queued > self._waiting and self._regular_slots() < self._max_slots:
                try:
                    self._start_slot(None)
                    # With the first slot, by the same thread: see `_express.py`.
                    with contextlib.suppress(RuntimeError):
                        self._start_express(None)
                except RuntimeError as exc:  # can't start new thread
                    if self._regular_slots():
                        return  # a busy slot takes the call when it is free
                    # No slot at all: take the call back; it fails, and is never run.
                    self._calls.take_back(call)
                    self._tokens.get_nowait()
                    self._queued -= 1
                    raise OffloadError(f"{self._owner}: could not start a slot thread: {exc}") from exc

    def grow(self) -> None:
        """Start idle slots up to `max_slots` (and the express slot) now,
        without waiting for their workers (for a strategy whose workers are
        slow to start: a pool that grew call by call would pay for it under
        load). Does nothing once `close` has begun, or if a slot thread cannot start."""
        with self.lock, contextlib.suppress(RuntimeError):
            while not self._stopping and self._regular_slots() < self._max_slots:
                self._start_slot(None)
            if not self._stopping:
                self._start_express(None)

    def start_all(self) -> None:
        """Start every slot and its worker now; return once each reported.
        Raises `ExecutorClosed` once `close` has begun, and the first start-up
        error: the slots stay, and no call ever sees that error (a later call
        starts the worker again)."""
        startup = Startup()
        with self.lock:
            if self._stopping:
                raise executor_closed(self._owner)
            # Slots already up started their workers (or will, at their next call).
            started = 0
            try:
                for _ in range(self._max_slots - self._regular_slots()):
                    self._start_slot(startup)
                    started += 1
                started += self._start_express(startup)
            except RuntimeError as exc:
                startup.expect(started)
                raise OffloadError(f"{self._owner}: could not start a slot thread: {exc}") from exc
            startup.expect(started)
        startup.wait()

    def _start_slot(self, startup: Startup | None) -> None:
        # With the lock held.
        number = next(self._numbers)
        slot = self._worker.new_slot(number)
        self._spawn(slot, str(number), self._take_calls(slot), startup)
        self._waiting += 1  # for its first token

    def _start_express(self, startup: Startup | None) -> bool:
        # With the lock held: whether it started (it does nothing if it runs, or if there is none).
        return self._express.start(self._numbers, partial(self._spawn, startup=startup))

    def _spawn(self, slot: S, name: str, work: Iterator[Call[Any]], startup: Startup | None) -> None:
        # With the lock held. The slot is registered only once its thread runs.
        thread = threading.Thread(
            target=self._main, args=(slot, work, startup), name=f"{self._thread_name}-{name}", daemon=True
        )
        thread.start()
        self._slots[slot] = thread

    def _main(self, slot: S, work: Iterator[Call[Any]], startup: Startup | None) -> None:
        worker = self._worker
        try:
            serve(
                work,
                start=partial(worker.start_worker, slot),
                ready=partial(worker.worker_ready, slot),
                run=partial(self._run, slot),
                fail=Call.set_exception,
                startup=startup,
            )
        finally:
            try:
                worker.stop_worker(slot)
            finally:
                self._discard(slot)

    def _run(self, slot: S, call: Call[Any]) -> None:
        try:
            self._worker.run(slot, call)
        except BaseException as exc:
            # A bug here must not leave the caller waiting forever.
            if not call.done:
                call.set_exception(OffloadError(f"{self._owner} failed: {exc!r}"))
            raise

    def _take_calls(self, slot: S) -> Generator[Call[Any], None, None]:
        """A slot's loop: the calls it claimed, until a stop token. Calls
        withdrawn while queued are skipped (`Call.claim`), so they never run."""
        get = self._tokens.get
        while True:
            token = get()
            with self.lock:
                self._waiting -= 1
                if token is None:
                    return
                self._queued -= 1
                call = self._calls.pop()
                if call is not None:
                    self._running[slot] = call
            if call is not None and call.claim():
                yield call
            with self.lock:
                self._running.pop(slot, None)
                self._waiting += 1
            del call  # don't keep the last call's arguments alive while idle

    def _discard(self, slot: S) -> None:
        """`slot` exited. If calls are still queued and no slot is left to take
        them, a fresh slot starts, even during shutdown (every queued call must
        end, and `join` waits for it); if none can start, they fail."""
        stranded: list[Call[Any]] = []
        failure: BaseException | None = None
        with self.lock:
            self._slots.pop(slot, None)
            self._running.pop(slot, None)
            if self._express.exited(slot):
                return
            if self._queued > self._waiting and self._regular_slots() < self._max_slots:
                try:
                    self._start_slot(None)
                except RuntimeError as exc:
                    if not self._slots:
                        failure = OffloadError(f"{self._owner}: could not start a slot thread: {exc}")
                        stranded = self._calls.drain()
                        self._queued = 0
                        # No slot is left to take their tokens: a later slot
                        # must not count them as calls.
                        while not self._tokens.empty():
                            self._tokens.get_nowait()
                else:
                    if self._stopping:
                        # `close` gave a stop token to each slot it saw: this
                        # one needs its own, after the calls it was started for.
                        self._tokens.put(None)
        for call in stranded:
            if call.claim():
                call.set_exception(failure)  # type: ignore[arg-type]

    # ---- shutdown ----------------------------------------------------------------

    def close(self, cancel_futures: bool) -> None:
        """Refuse new calls, drop the queued ones if `cancel_futures`, and tell
        every slot to exit once the calls ahead of it are done. Idempotent.

        Dropped calls are told outside the lock: their callbacks (a future's
        done-callbacks) may call back into the executor, shutdown included.
        """
        dropped: list[Call[Any]] = []
        with self.lock:
            if cancel_futures:
                stop_tokens = drained = 0
                while True:
                    try:
                        token = self._tokens.get_nowait()
                    except queue.Empty:
                        break
                    if token is None:
                        stop_tokens += 1  # from an earlier close: put back
                    else:
                        drained += 1
                for _ in range(stop_tokens):
                    self._tokens.put(None)
                # Slots that already took a token are waiting for this lock to
                # take their call: those calls are theirs (as if taken whole);
                # the rest are dropped.
                in_transit = self._queued - drained
                kept = [call for call in (self._calls.pop() for _ in range(in_transit)) if call]
                dropped = self._calls.drain()
                for call in kept:
                    self._calls.push(call)
                self._queued = in_transit
            if not self._stopping:
                self._stopping = True
                for _ in range(self._regular_slots()):
                    self._tokens.put(None)
                self._express.close()
        for call in dropped:
            call.drop()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until every slot has exited (the calling thread excepted, if
        it is a slot: a call may shut its own executor down), or `timeout`
        seconds; return whether they all did."""
        me = threading.current_thread()
        deadline = None if timeout is None else time.monotonic() + timeout
        # Until none is left: a slot that exits while calls are queued hands
        # them to a fresh one (`_discard`).
        while True:
            with self.lock:
                threads = [t for t in self._slots.values() if t is not me]
            if not threads:
                return True
            for thread in threads:
                if deadline is None:
                    thread.join()
                else:
                    thread.join(max(0.0, deadline - time.monotonic()))
                    if thread.is_alive():
                        return False

    def __len__(self) -> int:
        """Calls queued (withdrawn ones included until a slot reaches them)."""
        return len(self._calls)
