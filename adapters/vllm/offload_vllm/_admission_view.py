"""What the adapter reads of admission's state, outside admitting a request.

What is here is the only place the adapter reads the executor's counts (for
readiness and for a computed `Retry-After`): if the core's admission changes
shape, it is what to re-point. All of it is called on the event loop's thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import final

import offload

#: Readiness, once 503, turns 200 again only when a request of this many times
#: the typical cost would be admitted: a bound that frees room for one request
#: at a time (one answered every few ms under a flood) and fills again at once
#: would otherwise turn readiness over at every answer.
READY_AGAIN_FACTOR = 2.0


@final
class Readiness:
    """Whether readiness answers 503 for admission's sake (`refuses`)."""

    __slots__ = ("_typical_cost", "refusing")

    def __init__(self, typical_cost: Callable[[], float] = lambda: 1.0) -> None:
        #: The cost of a typical request of the default lane now: the mean of
        #: the requests answered of late (`DrainRates.typical_cost`).
        self._typical_cost = typical_cost
        #: What `refuses` last said.
        self.refusing = False

    def refuses(self, executor: offload.Executor) -> bool:
        """Readiness's rule, applied now: 503 from when a request of the typical
        cost in the default lane would be refused (the places of
        `OFFLOAD_VLLM_MAX_QUEUE` full, or the room under
        `OFFLOAD_VLLM_MAX_QUEUED_COST` below that cost), until one of
        `READY_AGAIN_FACTOR` times that cost would be admitted. A unit of cost
        1, the rule before, fits in a bound that refuses every real request
        (thousands of characters each)."""
        typical = self._typical_cost()
        self.refusing = executor.would_refuse(cost=READY_AGAIN_FACTOR * typical if self.refusing else typical)
        return self.refusing


def cost_to_drain(executor: offload.Executor, lane: str | None, cost: float) -> float | None:
    """How much queued cost must leave before a request of `cost` in `lane`
    (`None`: the default lane) is admitted under `max_queued_cost`
    (`Executor.cost_to_admit`, by admission's own rule): 0 when it would be
    admitted now; `None` without a cost bound."""
    return executor.cost_to_admit(cost=cost, lane=lane)
