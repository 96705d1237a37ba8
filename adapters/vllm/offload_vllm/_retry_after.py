"""A computed `Retry-After` for a 503 from a full bound.

How long the refused request's lane needs to drain enough cost to admit it
(`_admission_view.cost_to_drain`), at the rate that lane's cost has been
served of late (`DrainRates`): seconds, rounded up, between 1 and
`RETRY_AFTER_CAP_S`. Under `OFFLOAD_VLLM_MAX_QUEUE` alone (places, not cost),
the time the lane takes to serve one request. Until a lane has served
anything, 1 (the smallest the header allows).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import final

import offload

from ._admission_view import cost_to_drain
from ._lanes import DEFAULT_LANE

#: The longest `Retry-After`, in seconds. A server that expects to stay full
#: for longer than this is better left for another replica than waited for,
#: and a rate measured over the last `RATE_TIME_CONSTANT_S` says little about
#: the server half a minute on.
RETRY_AFTER_CAP_S = 30

#: The time constant of the served-rate average, in seconds: long enough to
#: span many requests of a flood (a few hundred at tens a second), short
#: enough that a change of load shows within a probe period or two.
RATE_TIME_CONSTANT_S = 10.0


@final
class _Rate:
    """An exponentially weighted rate of events that each carry an amount."""

    __slots__ = ("first", "last", "total")

    def __init__(self, now: float) -> None:
        self.first = self.last = now
        self.total = 0.0  # amount, decayed to `last`

    def add(self, amount: float, now: float) -> None:
        self.total = self.total * math.exp(-(now - self.last) / RATE_TIME_CONSTANT_S) + amount
        self.last = now

    def per_second(self, now: float) -> float:
        """Amount per second; while younger than the time constant, over its age."""
        decayed = self.total * math.exp(-(now - self.last) / RATE_TIME_CONSTANT_S)
        return decayed / max(min(RATE_TIME_CONSTANT_S, now - self.first), 1e-3)


@final
class DrainRates:
    """Per lane, the rate at which admitted requests and their cost were
    served (their admission ended). Used on the event loop's thread only."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._cost: dict[str, _Rate] = {}
        self._requests: dict[str, _Rate] = {}

    def served(self, lane: str | None, cost: float) -> None:
        """A request of `cost` in `lane` (`None`: default) was answered."""
        now = self._clock()
        name = DEFAULT_LANE if lane is None else lane
        for rates, amount in ((self._cost, cost), (self._requests, 1.0)):
            rate = rates.get(name)
            if rate is None:
                rate = rates[name] = _Rate(now)
            rate.add(amount, now)

    def seconds_to_serve(self, lane: str | None, cost: float | None) -> float | None:
        """Seconds `lane` takes to serve `cost` of cost (`None`: one request) at
        its measured rate; `None` before it has served anything."""
        name = DEFAULT_LANE if lane is None else lane
        rate = (self._requests if cost is None else self._cost).get(name)
        if rate is None:
            return None
        per_second = rate.per_second(self._clock())
        if per_second <= 0:
            return None
        return (1.0 if cost is None else cost) / per_second

    def retry_after(self, executor: offload.Executor, lane: str | None, cost: float) -> int:
        """`Retry-After` for a request of `cost` in `lane` just refused."""
        excess = cost_to_drain(executor, lane, cost)
        # Refused with no cost to drain: a place (OFFLOAD_VLLM_MAX_QUEUE) must free up.
        seconds = self.seconds_to_serve(lane, None if not excess else excess)
        return clamp_retry_after(seconds)


def clamp_retry_after(seconds: float | None) -> int:
    """Whole seconds, rounded up, between 1 and `RETRY_AFTER_CAP_S` (1 for `None`)."""
    if seconds is None or math.isnan(seconds):
        return 1
    return int(min(RETRY_AFTER_CAP_S, max(1, math.ceil(seconds))))
