"""`Lane` and `Flow`: what a call is counted and scheduled in, and a call's cost.

Below both `Call` (whose `lane` and `flow` they are) and `CallQueue` (which
schedules by them): this module imports neither.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, final

from ._errors import ConfigError

DEFAULT_LANE_NAME = "default"

#: The range of a lane's weight. Weights are ratios between lanes: outside
#: this range `cost / weight` (a lane's virtual time, the vLLM adapter's engine
#: priority) or a lane's share of `max_queued_cost` overflows or underflows
#: for realistic costs (a subnormal weight makes `1 / weight` infinite).
MIN_WEIGHT = 1e-9
MAX_WEIGHT = 1e9


def check_cost(cost: object, *, source: str = "cost") -> float:
    """Validate a call's cost: a finite number >= 0 (not a `bool`)."""
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not 0 <= cost < math.inf:
        raise ConfigError(f"{source} must be a finite number >= 0, got {cost!r}")
    return float(cost)


@final
class Lane:
    """A named share of an executor's workers (`Executor(lanes={name: weight})`).

    Backlogged lanes share the workers in proportion to their weights, by
    the cost of the calls served, and an executor's `max_queued_cost` and
    `max_queue` the same way. The weight is a number from `MIN_WEIGHT` (1e-9)
    to `MAX_WEIGHT` (1e9). Immutable; compared by identity.
    """

    __slots__ = ("name", "weight")

    def __init__(self, name: str, weight: float = 1.0) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a lane name must be a non-empty string, got {name!r}")
        if (
            isinstance(weight, bool)
            or not isinstance(weight, (int, float))
            or not MIN_WEIGHT <= weight <= MAX_WEIGHT
        ):
            raise ConfigError(
                f"lane {name!r}: the weight must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}, "
                f"got {weight!r}"
            )
        self.name = name
        self.weight = float(weight)

    def __repr__(self) -> str:
        return f"<Lane {self.name!r} weight={self.weight:g}>"


@final
class Flow:
    """Calls that share one fair share of their lane, served in their order.

    Made by `Executor.admission` for a unit of work (a server request); its
    calls are served one after another while other flows' calls interleave.
    """

    __slots__ = ("_calls", "_finish", "_queue", "_start", "lane")

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        # Scheduling state, valid for the queue that set it (a queue made after
        # a fork must not inherit a finish tag from its parent's queue).
        self._queue: object = None
        self._finish = 0.0
        self._start = 0.0  # its head call's start tag (its finish less its cost)
        # Its queued `Call`s (typed loosely: this module stays below `_call`).
        self._calls: deque[Any] = deque()

    def __repr__(self) -> str:
        return f"<Flow lane={self.lane.name!r} queued={len(self._calls)}>"
