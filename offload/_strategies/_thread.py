"""`thread`: a bounded pool of worker threads."""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from typing import Any, final

from .._call import Call
from .._config import check_initializer, check_max_workers, default_thread_workers
from .._errors import ExecutorClosed, OffloadError
from .._executor import Executor
from .._worker_state import _NO_STATE

_pool_ids = itertools.count()


@final
class ThreadExecutor(Executor):
    """Runs calls on up to `max_workers` threads, started on demand and kept.

    Threads help while the call releases the GIL (tokenizers in Rust, NumPy,
    Pillow decoding, I/O); pure-Python work still competes with the event loop
    for the GIL (use `process` for that).

    Calls are handed to workers through one FIFO queue, and a worker wakes the
    waiting task directly (no `concurrent.futures.Future` chain), which is why
    this strategy is cheaper per call than `loop.run_in_executor`.

    Workers are daemon threads, so a stuck call cannot hold up interpreter
    exit; `shutdown(wait=True)` still joins them all.

    Args:
        max_workers: at most this many calls run at once. `None`: `OFFLOAD_MAX_WORKERS`,
            else `min(32, cpus + 4)` (the standard library's default).
        initializer: run once in each new worker thread; its return value is
            that thread's `worker_state()`. If it raises, the call that started
            the worker fails with `OffloadError` (the cause attached) and the
            thread exits; the next call starts a fresh one.
        initargs: positional arguments for `initializer`.
        thread_name_prefix: names the threads `{prefix}-{pool}-{n}`.
    """

    name = "thread"

    def __init__(
        self,
        max_workers: int | None = None,
        *,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
        thread_name_prefix: str = "offload-thread",
    ) -> None:
        self._max_workers = (
            default_thread_workers() if max_workers is None else check_max_workers(max_workers)
        )
        check_initializer(initializer, initargs)
        self._initializer = initializer
        self._initargs = initargs
        self._name = f"{thread_name_prefix}-{next(_pool_ids)}"
        self._queue: queue.SimpleQueue[Call[Any] | None] = queue.SimpleQueue()
        self._threads: set[threading.Thread] = set()
        self._idle = 0  # workers waiting on the queue with no call reserved for them
        self._lock = threading.Lock()
        self._stopping = False
        self._spawned = itertools.count()

    @property
    def max_workers(self) -> int:
        return self._max_workers

    def _schedule(self, call: Call[Any]) -> None:
        with self._lock:
            if self._stopping:
                raise ExecutorClosed("ThreadExecutor is shut down")
            self._queue.put(call)
            if self._idle:
                self._idle -= 1
            elif len(self._threads) < self._max_workers:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}-{next(self._spawned)}", daemon=True
                )
                self._threads.add(thread)
                thread.start()

    def _work(self) -> None:
        state: Any = _NO_STATE
        if self._initializer is not None:
            try:
                state = self._initializer(*self._initargs)
            except BaseException as exc:
                self._fail_start(exc)
                return
        get = self._queue.get
        while True:
            call = get()
            if call is None:
                break
            if call.claim():
                call.execute(state)
            del call  # don't keep the last call's arguments alive while idle
            with self._lock:
                self._idle += 1
        with self._lock:
            self._threads.discard(threading.current_thread())

    def _fail_start(self, exc: BaseException) -> None:
        with self._lock:
            self._threads.discard(threading.current_thread())
        call = self._queue.get()
        if call is None:
            return
        if call.claim():
            error = OffloadError(f"worker initializer {self._initializer!r} failed: {exc!r}")
            error.__cause__ = exc
            call.set_exception(error)

    def _shutdown(self, wait: bool, cancel_futures: bool) -> None:
        with self._lock:
            if cancel_futures:
                sentinels = 0
                while True:
                    try:
                        pending = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if pending is None:
                        sentinels += 1  # from an earlier shutdown: put back
                    else:
                        pending.drop()
                for _ in range(sentinels):
                    self._queue.put(None)
            if not self._stopping:
                self._stopping = True
                for _ in self._threads:
                    self._queue.put(None)
            threads = list(self._threads)
        if wait:
            me = threading.current_thread()
            for thread in threads:
                if thread is not me:
                    thread.join()
