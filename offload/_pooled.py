"""`PooledStrategy`: a strategy whose calls run on a pool of slot workers
(public as `offload.strategy.PooledStrategy`)."""

from __future__ import annotations

import abc
from typing import Any, Generic, TypeVar

from ._call import Call
from ._checks import check_cost, check_max_workers
from ._dispatch import Dispatcher
from ._slot_worker import SlotWorker
from ._strategy import Strategy

S = TypeVar("S")


class PooledStrategy(Strategy, Generic[S]):
    """A strategy that owns a `Dispatcher` built from a slot worker: what
    `thread`, `process` and `ray` are made of.

    **Audience.** Strategy authors whose workers are a pool. A subclass sets
    `name`, calls `super().__init__(max_workers, ...)` once its own options
    are checked, and implements `new_slot_worker`: the `SlotWorker` that says
    what one slot does (make a slot, start its worker, run a call on it, stop
    it). This class does the rest: `capacity`, `schedule`, `start`,
    `shutdown` and `after_fork_in_child` (a fresh dispatcher, from a fresh
    slot worker). A subclass that extends one of them calls `super()`.

    Args:
        max_workers: slots (and concurrent calls), a positive `int`; the
            subclass resolves its own default first.
        express_cost: above 0, one more slot that runs only cheap calls (see
            `Dispatcher`); the slot worker must then be an
            `ExpressSlotWorker`. 0 (default): none. `max_workers` and
            `capacity()` do not count it.
        thread_name: the slot threads' name prefix (default `offload-{name}`).
    """

    def __init__(
        self,
        max_workers: int,
        *,
        express_cost: float = 0.0,
        thread_name: str | None = None,
    ) -> None:
        self._max_workers = check_max_workers(max_workers)
        self._express_cost = check_cost(express_cost, source="express_cost")
        self._thread_name = thread_name
        self._dispatch = self._new_dispatcher()

    @abc.abstractmethod
    def new_slot_worker(self) -> SlotWorker[S]:
        """The per-slot part of this strategy, for a new dispatcher: called
        once by `__init__`, and again in a child after `os.fork()` (the
        parent's workers are not the child's)."""

    def _new_dispatcher(self) -> Dispatcher[S]:
        return Dispatcher(
            self.name,
            self._max_workers,
            self.new_slot_worker(),
            thread_name=self._thread_name,
            express_cost=self._express_cost,
        )

    @property
    def dispatcher(self) -> Dispatcher[S]:
        """The dispatcher the calls wait in (replaced after a fork)."""
        return self._dispatch

    @property
    def max_workers(self) -> int:
        return self._max_workers

    @property
    def express_cost(self) -> float:
        """The express worker's bound (0: there is none)."""
        return self._express_cost

    def capacity(self) -> int:
        # Not the express worker: it takes a call only beside a far costlier one.
        return self._max_workers

    def schedule(self, call: Call[Any]) -> None:
        self._dispatch.put(call)

    def start(self) -> None:
        self._dispatch.start_all()

    def shutdown(self, wait: bool, cancel_futures: bool) -> None:
        self._dispatch.close(cancel_futures)
        if wait:
            self._dispatch.join()

    def after_fork_in_child(self) -> None:
        # The parent's slot threads do not exist here, and its workers and
        # queued calls are its own: a fresh pool, closed if the parent's was.
        stopping = self._dispatch.stopping
        self._dispatch = self._new_dispatcher()
        if stopping:
            self.shutdown(wait=False, cancel_futures=True)
