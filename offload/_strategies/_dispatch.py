"""The hand-off shared by the pool strategies (`thread`, `process`).

One FIFO queue of calls; worker threads started on demand up to `max_workers`
and kept; a call reserves an idle worker or starts a new one. Each worker is
a thread of this process that loops over `Dispatcher.calls()` — for `thread`
it runs the call itself, for `process` it drives one worker process.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar, final

from .._call import Call
from .._errors import ExecutorClosed

W = TypeVar("W")


@final
class Dispatcher(Generic[W]):
    """Hands calls to at most `max_workers` workers (`W`: whatever the strategy
    keeps per worker). `start_worker()` must create a worker whose thread loops
    over `calls()` and then calls `discard(worker)`, start it, and return it."""

    def __init__(self, owner: str, max_workers: int, start_worker: Callable[[], W]) -> None:
        self._owner = owner
        self._max_workers = max_workers
        self._start_worker = start_worker
        self._queue: queue.SimpleQueue[Call[Any] | None] = queue.SimpleQueue()
        self._workers: set[W] = set()
        self._idle = 0  # workers waiting on the queue with no call reserved for them
        self._queued = 0  # calls in the queue (stop signals not counted)
        self._stopping = False
        self.lock = threading.Lock()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def workers(self) -> list[W]:
        with self.lock:
            return list(self._workers)

    def put(self, call: Call[Any]) -> None:
        """Queue `call`; raise `ExecutorClosed` once `close` has begun."""
        with self.lock:
            if self._stopping:
                raise ExecutorClosed(f"{self._owner} is shut down")
            self._queue.put(call)
            self._queued += 1
            if self._idle:
                self._idle -= 1
            elif len(self._workers) < self._max_workers:
                self._workers.add(self._start_worker())

    def fill(self, start_worker: Callable[[], W]) -> int:
        """Start idle workers up to `max_workers` with `start_worker` (for
        `Executor.start`); return how many were started. Raises
        `ExecutorClosed` once `close` has begun."""
        with self.lock:
            if self._stopping:
                raise ExecutorClosed(f"{self._owner} is shut down")
            started = 0
            while len(self._workers) < self._max_workers:
                self._workers.add(start_worker())
                self._idle += 1
                started += 1
            return started

    def calls(self) -> Generator[Call[Any], None, None]:
        """A worker's loop: the calls it claimed, in order, until shutdown.

        Calls cancelled while queued are skipped here (`Call.claim`), so they never run.
        """
        get = self._queue.get
        while True:
            call = get()
            if call is None:
                return
            with self.lock:
                self._queued -= 1
            if call.claim():
                yield call
            del call  # don't keep the last call's arguments alive while idle
            with self.lock:
                self._idle += 1

    def discard(self, worker: W) -> None:
        """`worker` has exited (its loop ended, or it gave up: a failed initializer).

        If calls are still queued and no worker is left to take them (a worker
        that gave up took only one), a fresh worker is started for them, even
        during shutdown: every queued call must end, and `close` waits for it.
        """
        with self.lock:
            self._workers.discard(worker)
            if self._queued > self._idle and len(self._workers) < self._max_workers:
                try:
                    self._workers.add(self._start_worker())
                except Exception:  # noqa: S110 (no thread to start: the next `put` retries)
                    pass

    def close(self, cancel_futures: bool) -> list[W]:
        """Refuse new calls, drop queued ones if `cancel_futures`, tell every
        worker to stop after the calls ahead of it; return the workers to join.
        Idempotent.

        Dropped calls are told outside the lock: their callbacks (a future's
        done-callbacks) may call back into the executor, `shutdown()` included.
        """
        dropped: list[Call[Any]] = []
        with self.lock:
            if cancel_futures:
                stop_signals = 0
                while True:
                    try:
                        pending = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if pending is None:
                        stop_signals += 1  # from an earlier close: put back
                    else:
                        self._queued -= 1
                        dropped.append(pending)
                for _ in range(stop_signals):
                    self._queue.put(None)
            if not self._stopping:
                self._stopping = True
                for _ in self._workers:
                    self._queue.put(None)
            workers = list(self._workers)
        for call in dropped:
            call.drop()
        return workers
