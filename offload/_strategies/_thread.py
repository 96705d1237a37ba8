"""`thread`: a bounded pool of worker threads."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, final

from .._config import default_thread_workers
from .._niceness import DEFAULT_NICE, check_nice, lower_this_thread
from .._pooled import PooledStrategy
from .._slot_interface import ThreadSlot, ThreadSlotWorker

_pool_ids = itertools.count()


@final
class _NicedThreads(ThreadSlotWorker):
    """`thread`'s slots: worker threads below the loop's priority (`nice`),
    the express slot's excepted."""

    def __init__(self, initializer: Callable[..., Any] | None, initargs: tuple[Any, ...], nice: int) -> None:
        super().__init__(initializer, initargs)
        self._nice = nice

    def prepare_thread(self, slot: ThreadSlot) -> None:
        lower_this_thread(0 if slot.express else self._nice)


@final
class ThreadStrategy(PooledStrategy[ThreadSlot]):
    """Runs calls on up to `max_workers` threads, started on demand and kept.

    Threads help while the call releases the GIL (tokenizers in Rust, NumPy,
    Pillow decoding, I/O); pure-Python work still competes with the event loop
    for the GIL (use `process` for that).
    """

    name = "thread"

    def __init__(
        self,
        max_workers: int | None = None,
        *,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
        thread_name_prefix: str = "offload-thread",
        nice: int = DEFAULT_NICE,
        express_cost: float = 0.0,
    ) -> None:
        """The pool's options; nothing starts until the first call.

        **Priority.** On Linux, where each thread has a niceness of its own,
        worker threads run at `nice` (default 10) above the niceness of the
        thread that started them, so when the cores are busy the event loop's
        thread gets one first. That helps against CPU contention only: a worker
        running Python code still holds the GIL, which priority does not change.
        Elsewhere threads share the process's priority and `nice` does nothing.

        A worker wakes the waiting task directly (no `concurrent.futures.Future`
        chain), which is why this strategy is cheaper per call than
        `loop.run_in_executor`. Workers are daemon threads, so a stuck call
        cannot hold up interpreter exit; `shutdown(wait=True)` still joins them all.

        Args:
            max_workers: at most this many calls run at once. `None`: `OFFLOAD_MAX_WORKERS`,
                else `min(32, cpus + 4)` (the standard library's default).
            initializer: run once in each worker thread, before its first call;
                its return value is that thread's `worker_state()`. If it raises,
                the call the thread took fails with `OffloadError` (the cause
                attached), and the thread tries again at its next call.
            initargs: positional arguments for `initializer`.
            thread_name_prefix: names the threads `{prefix}-{pool}-{n}`.
            nice: added to each worker thread's niceness (0 to 19; default 10,
                Linux only); 0 runs them at the loop's priority.
            express_cost: above 0, one more thread, the *express* worker, runs
                calls priced at most this (in the callers' cost unit) and at most
                a quarter of the costliest call running on the other threads
                (`offload.strategy.Dispatcher`), in the queue's fair order, at
                the loop's priority (no `nice`): a cheap call does not wait for a
                worker busy with a far longer call. 0 (default): none.
                `max_workers` and `capacity()` do not count it.
        """
        self._nice = check_nice(nice)
        self._prefix = thread_name_prefix
        super().__init__(max_workers, initializer=initializer, initargs=initargs, express_cost=express_cost)

    def default_max_workers(self) -> int:
        return default_thread_workers()

    def thread_name_prefix(self) -> str:
        return f"{self._prefix}-{next(_pool_ids)}"

    def new_slot_worker(self) -> _NicedThreads:
        return _NicedThreads(self.initializer, self.initargs, self._nice)
