"""offload: keep an async server's event loop alive.

Run blocking pre- and post-processing under a strategy you choose
(`inline`, `thread`, `process`, `async-renderer`), the same way on asyncio,
uvloop and trio. Writing a strategy: `offload.strategy`.

The map (one module each):

- `_executor`: `Executor`, the front: lanes, admission, deadlines, shutdown.
- `_registry`, `_decorator`: `get_executor(name)`, `make_async`.
- `_lanes`: `Lane`, `Lanes`, `Flow`. `_checks`: argument checks.
  `_admission`: admission in one place: `Limiter` counts, refuses (the rule,
  `max_queue` and `max_queued_cost`) and holds; `Admission`, a unit of work
  admitted once. `_metrics`: the Prometheus side, a listener on the `Limiter`.
- `_lag`: the loop-lag sampler (`LoopLagMonitor`, `sample_loop_lag`).
- `_call`: `Call`, one call's state. `_call_front`: `CallOptions`, the front
  every call is made through, and its outcome as its caller waits for it
  (awaited, deadline, `Future`).
- `_strategy`: the `Strategy` interface; `_strategies/`: one module per
  strategy. `_queue`: the fair `CallQueue`; `_dispatch`: slot threads
  serving it; `_express`: the express slot; `_slot_interface`: `SlotWorker`,
  what a slot does with its worker; `_worker_lifecycle`: a worker's start-up
  rule; `_initializer_state`: `worker_state()`, what the initializer built;
  `_pooled`: `PooledStrategy`, a pool strategy's base. `_builtins`: the
  built-in strategies' names and facts, one table.
- `testing/`: the contract suite, one mixin per concern (`_contract_*`).

One call: `Executor.run` makes a `Call` and stamps its lane → `_start`
admits it (`_admission.Limiter`) → `Strategy.schedule` → `CallQueue.push`
→ a slot pops it, `Call.claim()`, runs it → `set_result` wakes the caller
(`_call_front.run_call`).
"""

from . import strategy as strategy
from ._admission import Admission as Admission
from ._call import Call as Call
from ._call import collect_call_times as collect_call_times
from ._call_front import CallOptions as CallOptions
from ._decorator import make_async as make_async
from ._decorator import shutdown_shared_executors as shutdown_shared_executors
from ._errors import ConfigError as ConfigError
from ._errors import ExecutorClosed as ExecutorClosed
from ._errors import OffloadError as OffloadError
from ._errors import Overloaded as Overloaded
from ._errors import WorkerCrashed as WorkerCrashed
from ._executor import Executor as Executor
from ._initializer_state import worker_state as worker_state
from ._lag import LoopLagMonitor as LoopLagMonitor
from ._lag import sample_loop_lag as sample_loop_lag
from ._metrics import metrics_enabled as metrics_enabled
from ._registry import STRATEGIES as STRATEGIES
from ._registry import get_executor as get_executor

__version__ = "0.1.0"

__all__ = [
    "STRATEGIES",
    "Admission",
    "Call",
    "CallOptions",
    "ConfigError",
    "Executor",
    "ExecutorClosed",
    "LoopLagMonitor",
    "OffloadError",
    "Overloaded",
    "WorkerCrashed",
    "collect_call_times",
    "get_executor",
    "make_async",
    "metrics_enabled",
    "sample_loop_lag",
    "shutdown_shared_executors",
    "worker_state",
]

# Public names report the public module (`offload.Overloaded` in reprs and
# tracebacks, as httpx does); pickling finds them there too.
for _name in __all__:
    _value = globals()[_name]
    if isinstance(_value, type) or callable(_value) and hasattr(_value, "__qualname__"):
        _value.__module__ = "offload"
del _name, _value
