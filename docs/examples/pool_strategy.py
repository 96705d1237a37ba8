"""Write your own strategy: calls in a `concurrent.futures.ProcessPoolExecutor`.

The calls cross into worker processes, so this strategy uses the helpers
for that (`offload.strategy`): `by_reference` to send a function that
`make_async` decorated, `portable_error` to send an exception back with its
traceback, `set_worker_state` so that `offload.worker_state()` works in the
worker. `Dispatcher` gives the queue, the slot threads, start-up and
shutdown; a slot drives one worker, so each slot has a pool of one process:
a worker that dies takes only its own pool down, and its slot starts another.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, final

import anyio

import offload
from offload.strategy import (
    Call,
    Dispatcher,
    Strategy,
    by_reference,
    check_initializer,
    check_max_workers,
    count_worker_restart,
    initializer_failed,
    portable_error,
    set_worker_state,
    usable_cpu_count,
)

_START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"

# ---- in the worker process ------------------------------------------------------

_init_error: BaseException | None = None


def _init_worker(initializer: Callable[..., Any] | None, initargs: tuple[Any, ...]) -> None:
    # The pool's own initializer. It never raises (that would break the pool
    # with no word of why): `_ready` reports the error.
    global _init_error
    if initializer is not None:
        try:
            set_worker_state(initializer(*initargs))
        except BaseException as exc:
            _init_error = portable_error(exc)


def _ready() -> BaseException | None:
    return _init_error


def _run(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[bool, Any]:
    try:
        return True, fn(*args, **kwargs)
    except BaseException as exc:
        return False, portable_error(exc)


# ---- in the caller's process ------------------------------------------------------


@final
class _Slot:
    def __init__(self) -> None:
        #: This slot's worker: a pool of one process (`None`: none yet, or it died).
        self.pool: ProcessPoolExecutor | None = None


@final
class PoolStrategy(Strategy):
    """Runs calls in `max_workers` worker processes (default:
    `OFFLOAD_MAX_WORKERS`, else the usable CPUs), each a one-process
    `ProcessPoolExecutor`."""

    name = "pool"
    carries_context = False  # calls run in other processes
    replaces_crashed_workers = True  # a slot whose worker died starts another

    def __init__(
        self,
        max_workers: int | None = None,
        *,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
    ) -> None:
        check_initializer(initializer, initargs)
        self._initializer, self._initargs = initializer, initargs
        self._size = usable_cpu_count() if max_workers is None else check_max_workers(max_workers)
        self._dispatch = Dispatcher(self.name, self._size, self)

    @property
    def max_workers(self) -> int:
        return self._size

    # The strategy: the executor calls these.
    def capacity(self) -> int:
        return self._size

    def schedule(self, call: Call[Any]) -> None:
        self._dispatch.put(call)

    def start(self) -> None:
        self._dispatch.start_all()

    def shutdown(self, wait: bool, cancel_futures: bool) -> None:
        self._dispatch.close(cancel_futures)
        if wait:
            self._dispatch.join()

    def after_fork_in_child(self) -> None:
        # The parent's slot threads and worker processes are the parent's.
        stopping = self._dispatch.stopping
        self._dispatch = Dispatcher(self.name, self._size, self)
        if stopping:
            self._dispatch.close(cancel_futures=True)

    # One slot: the dispatcher calls these on the slot's own thread.
    def new_slot(self, number: int) -> _Slot:
        return _Slot()

    def start_worker(self, slot: _Slot) -> None:
        pool = ProcessPoolExecutor(
            1,
            # Not "fork": this process has threads.
            mp_context=multiprocessing.get_context(_START_METHOD),
            initializer=_init_worker,
            initargs=(self._initializer, self._initargs),
        )
        try:
            error = pool.submit(_ready).result()
        except BaseException:
            pool.shutdown(wait=False)
            raise
        if error is not None:
            pool.shutdown(wait=False)  # the next call starts a fresh worker and tries again
            raise initializer_failed(self._initializer, error) from error
        slot.pool = pool

    def worker_ready(self, slot: _Slot) -> bool:
        return slot.pool is not None

    def run(self, slot: _Slot, call: Call[Any]) -> None:
        pool = slot.pool
        assert pool is not None
        try:
            ok, value = pool.submit(_run, by_reference(call.fn), call.args, call.kwargs).result()
        except BrokenProcessPool as exc:
            slot.pool = None  # the slot starts a new worker before its next call
            pool.shutdown(wait=False)
            call.set_exception(offload.WorkerCrashed(f"pool strategy: the worker died: {exc}"))
            count_worker_restart(self, "crashed")
            return
        except BaseException as exc:  # the call or its result could not be pickled
            call.set_exception(exc)
            return
        if ok:
            call.set_result(value)
        else:
            call.set_exception(value)

    def stop_worker(self, slot: _Slot) -> None:
        pool, slot.pool = slot.pool, None
        if pool is not None:
            pool.shutdown(wait=True)


def where() -> int:
    return os.getpid()


async def main() -> None:
    async with offload.Executor(PoolStrategy(2), max_queue=64) as executor:
        print("ran in process", await executor.run(where), "; this one is", os.getpid())


if __name__ == "__main__":
    anyio.run(main)
