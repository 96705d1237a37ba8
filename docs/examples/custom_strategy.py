"""Write your own strategy: threads pinned to CPU cores, on offload's public interface.

`PooledStrategy` gives the queue (fair by lane, flow and cost), the slot
threads, start-up, shutdown and fork handling; the strategy gives it a slot
worker that says what one slot does. Here the slot's thread is its worker
(`ThreadSlotWorker`: it runs the initializer, then the calls), and all this
strategy adds is what the thread does first: pin itself to a core (Linux:
`sched_setaffinity(0, ...)` applies to the calling thread). `offload.Executor`
adds admission, deadlines, lanes and metrics around it.
"""

from __future__ import annotations

import os
from typing import final

import anyio

import offload
from offload.strategy import PooledStrategy, ThreadSlot, ThreadSlotWorker


@final
class _PinnedThreads(ThreadSlotWorker):
    """Slot threads, each pinned to a core in turn."""

    def prepare_thread(self, slot: ThreadSlot) -> None:
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[slot.number % len(cores)]})


@final
class PinnedThreadStrategy(PooledStrategy[ThreadSlot]):
    """Up to `max_workers` threads (default: one per allowed core), each
    pinned to a core in turn; `initializer` and `initargs` as for `thread`."""

    name = "pinned-thread"

    def default_max_workers(self) -> int:
        return len(os.sched_getaffinity(0))

    def new_slot_worker(self) -> _PinnedThreads:
        return _PinnedThreads(self.initializer, self.initargs)


def where() -> set[int]:
    return os.sched_getaffinity(0)


async def main() -> None:
    async with offload.Executor(PinnedThreadStrategy(), max_queue=64) as executor:
        print("ran on cores", sorted(await executor.run(where)))


if __name__ == "__main__":
    anyio.run(main)
