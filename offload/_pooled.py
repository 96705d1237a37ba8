"""`PooledStrategy`: a strategy whose calls run on a pool of slot workers
(public as `offload.strategy.PooledStrategy`)."""

from __future__ import annotations

import abc
import itertools
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ._call import Call
from ._checks import check_cost, check_initializer, check_max_workers
from ._config import usable_cpu_count
from ._dispatch import Dispatcher
from ._slot_interface import SlotWorker
from ._strategy import Strategy

S = TypeVar("S")

_pool_ids = itertools.count()


class PooledStrategy(Strategy, Generic[S]):
    """A strategy that owns a `Dispatcher` built from a slot worker: what
    `thread`, `process` and `ray` are made of.
    """

    def __init__(
        self,
        max_workers: int | None = None,
        *,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
        express_cost: float = 0.0,
    ) -> None:
        """The options every pool takes.

        **Audience.** Strategy authors whose workers are a pool. A subclass sets
        `name` and implements `new_slot_worker`: the `SlotWorker` that says what
        one slot does (make a slot, start its worker, run a call on it, stop
        it). This class does the rest: the options every pool takes (below),
        `capacity`, `schedule`, `start`, `shutdown` and `after_fork_in_child` (a
        fresh dispatcher, from a fresh slot worker). A subclass with options of
        its own checks them in its `__init__` and then calls
        `super().__init__(...)`; one that extends a method calls `super()`.

        Args:
            max_workers: slots (and concurrent calls), a positive `int`. `None`:
                `default_max_workers()`.
            initializer: run once by each worker, before its first call; what
                it returns is that worker's `offload.worker_state()`. Kept as
                `self.initializer` for the slot worker (`run_initializer`).
            initargs: positional arguments for `initializer` (`self.initargs`).
            express_cost: above 0, one more slot that runs only cheap calls (see
                `Dispatcher`); the slot worker must then be an
                `ExpressSlotWorker`. 0 (default): none. `max_workers` and
                `capacity()` do not count it.
        """
        check_initializer(initializer, initargs)
        #: What each worker runs first (`None`: nothing), and its arguments.
        self.initializer = initializer
        self.initargs = initargs
        self._max_workers = check_max_workers(
            self.default_max_workers() if max_workers is None else max_workers
        )
        self._express_cost = check_cost(express_cost, source="express_cost")
        self._thread_name = self.thread_name_prefix()
        self._dispatch = self._new_dispatcher()

    @abc.abstractmethod
    def new_slot_worker(self) -> SlotWorker[S]:
        """The per-slot part of this strategy, for a new dispatcher: called
        once by `__init__`, and again in a child after `os.fork()` (the
        parent's workers are not the child's)."""

    def default_max_workers(self) -> int:
        """`max_workers` when none is given (after `OFFLOAD_MAX_WORKERS`).
        Default: the CPUs this process may use."""
        return usable_cpu_count()

    def thread_name_prefix(self) -> str:
        """What the slot threads' names start with, asked once by `__init__`
        (they end in the slot's number). Default: `offload-{name}-{pool}`."""
        return f"offload-{self.name}-{next(_pool_ids)}"

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
