"""offload: keep an async server's event loop alive.

Run blocking pre- and post-processing under a strategy you choose
(`inline`, `thread`, `process`, `async-renderer`), the same way on asyncio,
uvloop and trio.
"""

from ._decorator import make_async as make_async
from ._decorator import shutdown_shared_executors as shutdown_shared_executors
from ._errors import ConfigError as ConfigError
from ._errors import ExecutorClosed as ExecutorClosed
from ._errors import OffloadError as OffloadError
from ._errors import WorkerCrashed as WorkerCrashed
from ._executor import Executor as Executor
from ._lag import LoopLagMonitor as LoopLagMonitor
from ._registry import STRATEGIES as STRATEGIES
from ._registry import get_executor as get_executor
from ._worker_state import worker_state as worker_state

__version__ = "0.1.0"

__all__ = [
    "STRATEGIES",
    "ConfigError",
    "Executor",
    "ExecutorClosed",
    "LoopLagMonitor",
    "OffloadError",
    "WorkerCrashed",
    "get_executor",
    "make_async",
    "shutdown_shared_executors",
    "worker_state",
]
