"""Write your own strategy: threads pinned to CPU cores, on offload's public interface.

`PooledStrategy` gives the queue (fair by lane, flow and cost), the slot
threads, start-up, shutdown and fork handling; the strategy says what one
slot does, in a slot worker of its own: pin its thread to a core (Linux:
`sched_setaffinity(0, ...)` applies to the calling thread), run the
initializer, then the calls it takes. `offload.Executor` adds admission,
deadlines, lanes and metrics around it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, final

import anyio

import offload
from offload.strategy import Call, PooledStrategy, check_initializer, run_initializer

_UNSTARTED: Any = object()


@final
class _Slot:
    def __init__(self, core: int) -> None:
        self.core = core
        self.state: Any = _UNSTARTED


@final
class _PinnedThreads:
    """One slot: the dispatcher calls these on the slot's own thread (`new_slot` excepted)."""

    def __init__(self, initializer: Callable[..., Any] | None, initargs: tuple[Any, ...]) -> None:
        self._initializer, self._initargs = initializer, initargs
        self.cores = sorted(os.sched_getaffinity(0))

    def new_slot(self, number: int) -> _Slot:
        return _Slot(self.cores[number % len(self.cores)])

    def start_worker(self, slot: _Slot) -> None:
        os.sched_setaffinity(0, {slot.core})
        slot.state = run_initializer(self._initializer, self._initargs)

    def worker_ready(self, slot: _Slot) -> bool:
        return slot.state is not _UNSTARTED

    def run(self, slot: _Slot, call: Call[Any]) -> None:
        call.execute(slot.state)

    def stop_worker(self, slot: _Slot) -> None:
        slot.state = _UNSTARTED


@final
class PinnedThreadStrategy(PooledStrategy[_Slot]):
    """Up to `max_workers` threads (default: one per allowed core), each pinned to a core in turn."""

    name = "pinned-thread"

    def __init__(
        self,
        max_workers: int | None = None,
        *,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
    ) -> None:
        check_initializer(initializer, initargs)
        self._slot_worker = _PinnedThreads(initializer, initargs)
        super().__init__(len(self._slot_worker.cores) if max_workers is None else max_workers)

    def new_slot_worker(self) -> _PinnedThreads:
        return self._slot_worker


def where() -> set[int]:
    return os.sched_getaffinity(0)


async def main() -> None:
    async with offload.Executor(PinnedThreadStrategy(), max_queue=64) as executor:
        print("ran on cores", sorted(await executor.run(where)))


if __name__ == "__main__":
    anyio.run(main)
