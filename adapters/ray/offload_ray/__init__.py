"""offload-ray: the `ray` strategy for `offload`.

Installed next to `offload`, this package registers `RayStrategy` under the
strategy name `ray` (entry point group `offload.strategies`), so
`make_async(strategy="ray")`, `get_executor("ray")` and `OFFLOAD_STRATEGY=ray`
run calls on long-lived actors of a Ray cluster; `offload.Executor(RayStrategy(...))`
builds one directly. See docs/ray.md.

The package:

- `_strategy`: `RayStrategy`, an `offload.strategy.PooledStrategy` whose
  slots each drive one actor.
- `_actor`: `RayWorker`, the code that runs in an actor; its errors come
  back through `offload.strategy.portable_error` (checked with cloudpickle).
- `_arguments`: large arguments go through Ray's object store.
- `_connection`: the connection to Ray, made once by a long-lived thread, and fork.
- `_release`: killing actors; what `shutdown(wait=True)` waits for.

One call: `RayStrategy.schedule` queues it; a slot thread takes it and, in
`RayStrategy.run`, sends it with its arguments (`_arguments`) to its actor's
`RayWorker.run`, which answers the result or a portable exception.
"""

from ._arguments import DEFAULT_OBJECT_STORE_THRESHOLD as DEFAULT_OBJECT_STORE_THRESHOLD
from ._strategy import RayStrategy as RayStrategy

__version__ = "0.1.0"

__all__ = ["DEFAULT_OBJECT_STORE_THRESHOLD", "RayStrategy"]
