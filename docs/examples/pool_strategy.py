"""Write your own strategy: calls in a `concurrent.futures.ProcessPoolExecutor`.

The calls cross into worker processes, so this strategy uses the helpers
for that (`offload.strategy`): `by_reference` to send a function that
`make_async` decorated, `portable_error` to send an exception back with its
traceback, `set_worker_state` so that `offload.worker_state()` works in the
worker. `PooledStrategy` gives the queue, the slot threads, start-up,
shutdown and fork handling; a slot drives one worker, so each slot has a
pool of one process: a worker that dies takes only its own pool down, and
its slot starts another.
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
    PooledStrategy,
    by_reference,
    count_worker_restart,
    initializer_failed,
    portable_error,
    set_worker_state,
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
class _OneProcessPools:
    """One slot: the dispatcher calls these on the slot's own thread (`new_slot` excepted)."""

    def __init__(self, strategy: PoolStrategy) -> None:
        self._strategy = strategy  # for `count_worker_restart`

    def new_slot(self, number: int) -> _Slot:
        return _Slot()

    def start_worker(self, slot: _Slot) -> None:
        initializer = self._strategy.initializer
        pool = ProcessPoolExecutor(
            1,
            # Not "fork": this process has threads.
            mp_context=multiprocessing.get_context(_START_METHOD),
            initializer=_init_worker,
            initargs=(initializer, self._strategy.initargs),
        )
        try:
            error = pool.submit(_ready).result()
        except BaseException:
            pool.shutdown(wait=False)
            raise
        if error is not None:
            pool.shutdown(wait=False)  # the next call starts a fresh worker and tries again
            raise initializer_failed(initializer, error) from error
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
            count_worker_restart(self._strategy, "crashed")
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


@final
class PoolStrategy(PooledStrategy[_Slot]):
    """Runs calls in `max_workers` worker processes (default:
    `OFFLOAD_MAX_WORKERS`, else the usable CPUs), each a one-process
    `ProcessPoolExecutor`; `initializer` and `initargs` as for `process`
    (picklable)."""

    name = "pool"
    carries_context = False  # calls run in other processes
    replaces_crashed_workers = True  # a slot whose worker died starts another

    def new_slot_worker(self) -> _OneProcessPools:
        return _OneProcessPools(self)


def where() -> int:
    return os.getpid()


async def main() -> None:
    async with offload.Executor(PoolStrategy(2), max_queue=64) as executor:
        print("ran in process", await executor.run(where), "; this one is", os.getpid())


if __name__ == "__main__":
    anyio.run(main)
