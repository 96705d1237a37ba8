"""What the adapter reads of admission's state, outside admitting a request.

The two functions here are the only places the adapter reads the executor's
counts (for readiness and for a computed `Retry-After`): if the core's
admission changes shape, they are what to re-point. Both are called on the
event loop's thread.
"""

from __future__ import annotations

import offload


def refuses_default_lane(executor: offload.Executor) -> bool:
    """Whether admission would refuse a unit of cost 1 in the default lane now
    (`Executor.overloaded`): readiness answers 503 while it does."""
    return executor.overloaded


def cost_to_drain(executor: offload.Executor, lane: str | None, cost: float) -> float | None:
    """How much queued cost must leave before a request of `cost` in `lane`
    (`None`: the default lane) is admitted under `max_queued_cost`
    (`Executor.cost_to_admit`, by admission's own rule): 0 when it would be
    admitted now; `None` without a cost bound."""
    return executor.cost_to_admit(cost=cost, lane=lane)
