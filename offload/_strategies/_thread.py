"""`thread`: a bounded pool of worker threads."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any, final

from .._call import Call
from .._config import check_initializer, check_max_workers, default_thread_workers
from .._errors import OffloadError
from .._executor import Executor
from .._startup import Startup
from .._worker_state import _NO_STATE
from ._dispatch import Dispatcher
from ._fork import forget_in_child

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

    In a child made by `os.fork()`, the pool starts empty: the child's calls
    run on fresh threads of its own.

    Args:
        max_workers: at most this many calls run at once. `None`: `OFFLOAD_MAX_WORKERS`,
            else `min(32, cpus + 4)` (the standard library's default).
        initializer: run once in each new worker thread; its return value is
            that thread's `worker_state()`. If it raises, the call the worker
            took first fails with `OffloadError` (the cause attached) and the
            thread exits; a fresh worker takes the calls still queued.
        initargs: positional arguments for `initializer`.
        thread_name_prefix: names the threads `{prefix}-{pool}-{n}`.
        max_queue: calls that may wait for a busy pool before new ones fail
            with `Overloaded`. `None` (default): unbounded.
    """

    name = "thread"

    def __init__(
        self,
        max_workers: int | None = None,
        *,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
        thread_name_prefix: str = "offload-thread",
        max_queue: int | None = None,
    ) -> None:
        self._max_workers = (
            default_thread_workers() if max_workers is None else check_max_workers(max_workers)
        )
        check_initializer(initializer, initargs)
        self._initializer = initializer
        self._initargs = initargs
        self._name = f"{thread_name_prefix}-{next(_pool_ids)}"
        self._spawned = itertools.count()
        self._dispatch: Dispatcher[threading.Thread] = self._new_dispatcher()
        forget_in_child(self)
        self._set_max_queue(max_queue)

    def _new_dispatcher(self) -> Dispatcher[threading.Thread]:
        return Dispatcher("ThreadExecutor", self._max_workers, self._start_worker)

    def _after_fork_in_child(self) -> None:
        # The parent's threads do not exist here; its queued calls are its own.
        super()._after_fork_in_child()
        stopping = self._dispatch.stopping
        self._dispatch = self._new_dispatcher()
        if stopping:
            self._dispatch.close(cancel_futures=True)

    @property
    def max_workers(self) -> int:
        return self._max_workers

    def _capacity(self) -> int:
        return self._max_workers

    def start(self) -> None:
        super().start()
        startup = Startup()
        startup.expect(self._dispatch.fill(lambda: self._start_worker(startup)))
        startup.wait()

    def _start_worker(self, startup: Startup | None = None) -> threading.Thread:
        thread = threading.Thread(
            target=self._work, args=(startup,), name=f"{self._name}-{next(self._spawned)}", daemon=True
        )
        thread.start()
        return thread

    def _schedule(self, call: Call[Any]) -> None:
        self._dispatch.put(call)

    def _work(self, startup: Startup | None = None) -> None:
        calls = self._dispatch.calls()
        try:
            state: Any = _NO_STATE
            if self._initializer is not None:
                try:
                    state = self._initializer(*self._initargs)
                except BaseException as exc:
                    if startup is not None:
                        startup.finished(self._initializer_failed(exc))
                    # Report on one call, then exit: the next call starts a fresh worker.
                    for call in calls:
                        call.set_exception(self._initializer_failed(exc))
                        break
                    return
            if startup is not None:
                startup.finished()
            for call in calls:
                call.execute(state)
        finally:
            calls.close()
            self._dispatch.discard(threading.current_thread())

    def _initializer_failed(self, exc: BaseException) -> OffloadError:
        error = OffloadError(f"worker initializer {self._initializer!r} failed: {exc!r}")
        error.__cause__ = exc
        return error

    def _shutdown(self, wait: bool, cancel_futures: bool) -> None:
        self._dispatch.close(cancel_futures)
        if wait:
            me = threading.current_thread()
            # Until none is left: a worker whose initializer failed hands the
            # calls still queued to a fresh one (`Dispatcher.discard`).
            while others := [t for t in self._dispatch.workers() if t is not me]:
                for thread in others:
                    thread.join()
