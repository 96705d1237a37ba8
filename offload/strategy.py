"""Writing a strategy: the interface, and the pieces the built-in strategies are made of.

A strategy is a `Strategy` subclass: a `name`, `schedule(call)` and
`shutdown(wait, cancel_futures)`, and optional hooks (`start`, `capacity`,
`cancel_running`, `terminate_running`, `batch_form`, `after_fork_in_child`).
Users run it through `offload.Executor(strategy)` (or, once it is registered
under the entry-point group `offload.strategies`, `offload.get_executor(name)`),
which owns admission, deadlines, lanes, metrics, fork handling and the
closed state. See `Strategy` for the contract, and docs/strategies for a
complete example.

Helpers, public for strategy authors:

- `Call`: one call; workers `claim()` it, then `execute(state)` it or
  `set_result`/`set_exception` it.
- `CallQueue`: the fair queue (lanes by weight, flows by cost) every
  queuing strategy shares; `Lane`, `Lanes` (an executor's lanes, checked
  once), `Flow`.
- `PooledStrategy`: the base of a strategy whose workers are a pool (what
  `thread`, `process` and `ray` are): it owns a `Dispatcher` built from the
  `SlotWorker` the subclass makes, and implements `capacity`, `schedule`,
  `start`, `shutdown` and `after_fork_in_child` with it.
- `Dispatcher` and `SlotWorker`: a `CallQueue` served by slot threads, each
  driving one worker (a thread, a process, an actor). `ExpressSlotWorker`:
  a `SlotWorker` that can also make the express slot (cheap calls only).
  `ThreadSlotWorker` (with `ThreadSlot`): one whose slot threads are the
  workers, what `thread` is made of. `run_on_each_worker`: warm one pool
  that every slot shares (`start()`).
- `Startup`: what `start()` waits on.
- `check_max_workers`, `check_initializer`, `check_cost`, and by kind of
  value `check_positive_int`, `check_non_negative_number`,
  `check_positive_number`: argument checks with the house's messages. `run_initializer`: a worker's initializer, run once
  on its thread, its failure reported as `initializer_failed`;
  `replace_worker`: start a dead worker's successor now (its failure left to
  the next call, by the one start-up rule).
- `initializer_failed`, `executor_closed`: the errors users see, built once.
- `count_worker_restart`, `count_batch`: metrics only a strategy can see.
- `by_reference`, `portable_error`, `set_worker_state`: for workers in
  another process (send a `make_async`-decorated function, send back an
  exception with its traceback, make `offload.worker_state()` work there).

- `BUILTIN_STRATEGIES` (rows of `BuiltinStrategy`): the built-in strategies'
  names and what each is (where calls run, a pool, an express worker,
  batching), for adapters that must treat each kind differently.

Checking a strategy: `offload.testing.StrategyContract`, the contract suite.
"""

from ._admission import count_batch
from ._builtins import BUILTIN_STRATEGIES, BuiltinStrategy
from ._call import CANCELLED, DEADLINE, SHUTDOWN, Call
from ._checks import (
    check_cost,
    check_initializer,
    check_max_workers,
    check_non_negative_number,
    check_positive_int,
    check_positive_number,
)
from ._config import usable_cpu_count
from ._dispatch import Dispatcher
from ._errors import executor_closed, initializer_failed
from ._initializer_state import run_initializer, set_worker_state
from ._lanes import Flow, Lane, Lanes
from ._metrics import count_worker_restart
from ._pooled import PooledStrategy
from ._portable import by_reference, portable_error
from ._queue import CallQueue
from ._slot_interface import (
    ExpressSlotWorker,
    SlotWorker,
    ThreadSlot,
    ThreadSlotWorker,
    run_on_each_worker,
)
from ._startup import Startup
from ._strategy import Strategy
from ._worker_lifecycle import replace_worker

__all__ = [
    "BUILTIN_STRATEGIES",
    "CANCELLED",
    "DEADLINE",
    "SHUTDOWN",
    "BuiltinStrategy",
    "Call",
    "CallQueue",
    "Dispatcher",
    "ExpressSlotWorker",
    "Flow",
    "Lane",
    "Lanes",
    "PooledStrategy",
    "SlotWorker",
    "Startup",
    "Strategy",
    "ThreadSlot",
    "ThreadSlotWorker",
    "by_reference",
    "check_cost",
    "check_initializer",
    "check_max_workers",
    "check_non_negative_number",
    "check_positive_int",
    "check_positive_number",
    "count_batch",
    "count_worker_restart",
    "executor_closed",
    "initializer_failed",
    "portable_error",
    "replace_worker",
    "run_initializer",
    "run_on_each_worker",
    "set_worker_state",
    "usable_cpu_count",
]
