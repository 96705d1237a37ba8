"""offload-ray: the `ray` strategy for `offload`.

Installed next to `offload`, this package registers `RayStrategy` under the
strategy name `ray` (entry point group `offload.strategies`), so
`make_async(strategy="ray")`, `get_executor("ray")` and `OFFLOAD_STRATEGY=ray`
run calls on long-lived actors of a Ray cluster; `offload.Executor(RayStrategy(...))`
builds one directly. See docs/ray.md.
"""

from ._strategy import DEFAULT_OBJECT_STORE_THRESHOLD as DEFAULT_OBJECT_STORE_THRESHOLD
from ._strategy import RayStrategy as RayStrategy

__version__ = "0.1.0"

__all__ = ["DEFAULT_OBJECT_STORE_THRESHOLD", "RayStrategy"]
