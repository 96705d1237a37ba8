"""What the adapter reads of admission's state, outside admitting a request.

The two functions here are the only places the adapter reads the executor's
counts (for readiness and for a computed `Retry-After`): if the core's
admission changes shape, they are what to re-point. Both are called on the
event loop's thread.
"""

from __future__ import annotations

from typing import Any

import offload

from ._lanes import DEFAULT_LANE


def refuses_default_lane(executor: offload.Executor) -> bool:
    """Whether admission would refuse a unit of cost 1 in the default lane now
    (`Executor.overloaded`): readiness answers 503 while it does."""
    return executor.overloaded


def cost_to_drain(executor: offload.Executor, lane: str | None, cost: float) -> float | None:
    """How much queued cost must leave before a request of `cost` in `lane`
    (`None`: the default lane) is admitted under `max_queued_cost`, by the
    admission rule (`offload.Executor`'s **Admission**: within the total bound,
    or within the lane's weighted share): the smaller of the two excesses, 0
    when it would be admitted now; `None` without a cost bound.

    Reads the executor's tracker (`lane_queued_cost`, `queued_cost`), the one
    place outside admission that does."""
    bound = executor.max_queued_cost
    tracker: Any = getattr(executor, "_tracker", None)
    if bound is None or tracker is None:
        return None
    name = DEFAULT_LANE if lane is None else lane
    weights = executor.lanes
    share = bound * weights.get(name, 1.0) / max(sum(weights.values()), weights.get(name, 1.0))
    total_excess: float = tracker.queued_cost + cost - bound
    lane_excess: float = tracker.lane_queued_cost(name) + min(cost, share) - share
    return max(0.0, min(total_excess, lane_excess))
