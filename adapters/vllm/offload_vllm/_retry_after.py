"""A computed `Retry-After` for a 503 from a full bound.

How long the refused request's lane needs to drain enough cost to admit it
(`_admission_view.cost_to_drain`), and the cost of the clients refused before
it that are still waiting, at the rate that lane's cost has been served of
late (`DrainRates.retry_after`): seconds, rounded up, between 1 and
`RETRY_AFTER_CAP_S`. Under `OFFLOAD_VLLM_MAX_QUEUE` alone (places, not cost),
the same in requests. Until a lane has served anything, 1 (the smallest the
header allows).
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

#: The shortest span a rate is measured over, in seconds: the first refusals
#: of a flood come together (a hundred clients within milliseconds), and as a
#: rate over their few milliseconds they would read as thousands a second.
RATE_MIN_SPAN_S = 1.0

#: The time constant of the served-rate average, in seconds: long enough to
#: span many requests of a flood (a few hundred at tens a second), short
#: enough that a change of load shows within a probe period or two.
RATE_TIME_CONSTANT_S = 10.0


@final
class _Rate:
    """An exponentially weighted rate of events that each carry an amount."""

    __slots__ = ("first", "last", "total")

    def __init__(self) -> None:
        self.first: float | None = None  # the first event's time
        self.last = 0.0
        self.total = 0.0  # amount, decayed to `last`

    def add(self, amount: float, now: float) -> None:
        if self.first is None:
            self.first = now
        else:
            self.total *= math.exp(-(now - self.last) / RATE_TIME_CONSTANT_S)
        self.total += amount
        self.last = now

    def per_second(self, now: float) -> float:
        """Amount per second: the decayed total over the decayed time it spans
        (`tau * (1 - exp(-age / tau))`, at least `RATE_MIN_SPAN_S`), so a
        steady rate reads as itself however young the average (over its age,
        when much younger than `tau`); 0 before any event."""
        if self.first is None:
            return 0.0
        tau = RATE_TIME_CONSTANT_S
        decayed = self.total * math.exp(-(now - self.last) / tau)
        return decayed / max(tau * -math.expm1(-(now - self.first) / tau), RATE_MIN_SPAN_S)


@final
class _LaneRates:
    """One lane's served and refused rates, and the last `Retry-After` it gave."""

    __slots__ = ("refused_cost", "refused_requests", "retry_after", "served_cost", "served_requests")

    def __init__(self) -> None:
        self.served_cost = _Rate()
        self.served_requests = _Rate()
        self.refused_cost = _Rate()
        self.refused_requests = _Rate()
        self.retry_after = 1


@final
class DrainRates:
    """Per lane, the rates at which requests and their cost were served
    (their admission ended) and refused. Used on the event loop's thread only."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lanes: dict[str, _LaneRates] = {}

    def _lane(self, lane: str | None) -> _LaneRates:
        name = DEFAULT_LANE if lane is None else lane
        rates = self._lanes.get(name)
        if rates is None:
            rates = self._lanes[name] = _LaneRates()
        return rates

    def served(self, lane: str | None, cost: float) -> None:
        """A request of `cost` in `lane` (`None`: default) was answered."""
        now = self._clock()
        rates = self._lane(lane)
        rates.served_cost.add(cost, now)
        rates.served_requests.add(1.0, now)

    def typical_cost(self, lane: str | None = None) -> float:
        """The mean cost of the requests of `lane` answered of late, weighted as
        the served rates are (over `RATE_TIME_CONSTANT_S`); 1 before any."""
        now = self._clock()
        rates = self._lane(lane)
        requests = rates.served_requests.per_second(now)
        return rates.served_cost.per_second(now) / requests if requests > 0 else 1.0

    def retry_after(self, executor: offload.Executor, lane: str | None, cost: float) -> int:
        """`Retry-After` for a request of `cost` in `lane` just refused: the
        seconds its lane takes, at the rate it has been served, to serve what
        must drain before it is admitted (`cost_to_drain`; under
        `OFFLOAD_VLLM_MAX_QUEUE` alone, one request) plus what the clients
        refused before it and still waiting will bring back first. That
        backlog is Little's law: the lane's refusals per second times the
        `Retry-After` they were given. Without it, every client refused
        during a flood is told the same short wait, and they come back
        together to be refused again."""
        now = self._clock()
        rates = self._lane(lane)
        excess = cost_to_drain(executor, lane, cost)
        # Refused with no cost to drain: a place (OFFLOAD_VLLM_MAX_QUEUE) must free up.
        by_cost = bool(excess)
        served = rates.served_cost if by_cost else rates.served_requests
        refused = rates.refused_cost if by_cost else rates.refused_requests
        backlog = refused.per_second(now) * rates.retry_after
        rates.refused_cost.add(cost, now)
        rates.refused_requests.add(1.0, now)
        per_second = served.per_second(now)
        if per_second <= 0:
            return 1  # nothing served yet: the least the header allows
        need = (excess if by_cost and excess is not None else 1.0) + backlog
        rates.retry_after = clamp_retry_after(need / per_second)
        return rates.retry_after


def clamp_retry_after(seconds: float | None) -> int:
    """Whole seconds, rounded up, between 1 and `RETRY_AFTER_CAP_S` (1 for `None`)."""
    if seconds is None or math.isnan(seconds):
        return 1
    return int(min(RETRY_AFTER_CAP_S, max(1, math.ceil(seconds))))
