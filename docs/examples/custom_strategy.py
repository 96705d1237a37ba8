"""Write your own strategy: threads pinned to CPU cores, on offload's public interface.

`Dispatcher` gives the queue (fair by lane, flow and cost), the slot threads,
start-up, shutdown and joining; the strategy says what one slot does: pin its
thread to a core (Linux: `sched_setaffinity(0, ...)` applies to the calling
thread), run the initializer, then the calls it takes. `offload.Executor` adds
admission, deadlines, lanes, metrics and fork handling around it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, final

import anyio

import offload
from offload.strategy import (
    Call,
    Dispatcher,
    Strategy,
    check_initializer,
    check_max_workers,
    initializer_failed,
)

_UNSTARTED: Any = object()


@final
class _Slot:
    def __init__(self, core: int) -> None:
        self.core = core
        self.state: Any = _UNSTARTED


@final
class PinnedThreadStrategy(Strategy):
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
        self._initializer, self._initargs = initializer, initargs
        self._cores = sorted(os.sched_getaffinity(0))
        self._size = check_max_workers(max_workers or len(self._cores))
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
        self._dispatch = Dispatcher(self.name, self._size, self)

    # One slot: the dispatcher calls these on the slot's own thread.
    def new_slot(self, number: int) -> _Slot:
        return _Slot(self._cores[number % len(self._cores)])

    def start_worker(self, slot: _Slot) -> None:
        os.sched_setaffinity(0, {slot.core})
        try:
            slot.state = self._initializer(*self._initargs) if self._initializer else None
        except BaseException as exc:
            raise initializer_failed(self._initializer, exc) from exc

    def worker_ready(self, slot: _Slot) -> bool:
        return slot.state is not _UNSTARTED

    def run(self, slot: _Slot, call: Call[Any]) -> None:
        if self._initializer is None:
            call.execute()  # no worker_state()
        else:
            call.execute(slot.state)

    def stop_worker(self, slot: _Slot) -> None:
        slot.state = _UNSTARTED


def where() -> set[int]:
    return os.sched_getaffinity(0)


async def main() -> None:
    async with offload.Executor(PinnedThreadStrategy(), max_queue=64) as executor:
        print("ran on cores", sorted(await executor.run(where)))


if __name__ == "__main__":
    anyio.run(main)
