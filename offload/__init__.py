"""offload: keep an async server's event loop alive.

Run blocking pre- and post-processing under a strategy you choose
(`inline`, `thread`, `process`, `async-renderer`), the same way on asyncio,
uvloop and trio. Writing a strategy: `offload.strategy`.
"""

from . import strategy as strategy
from ._call import Call as Call
from ._call import collect_call_times as collect_call_times
from ._calling import CallOptions as CallOptions
from ._decorator import make_async as make_async
from ._decorator import shutdown_shared_executors as shutdown_shared_executors
from ._errors import ConfigError as ConfigError
from ._errors import ExecutorClosed as ExecutorClosed
from ._errors import OffloadError as OffloadError
from ._errors import Overloaded as Overloaded
from ._errors import WorkerCrashed as WorkerCrashed
from ._executor import Executor as Executor
from ._lag import LoopLagMonitor as LoopLagMonitor
from ._metrics import metrics_enabled as metrics_enabled
from ._metrics import sample_loop_lag as sample_loop_lag
from ._registry import STRATEGIES as STRATEGIES
from ._registry import get_executor as get_executor
from ._unit import Admission as Admission
from ._worker_state import worker_state as worker_state

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
