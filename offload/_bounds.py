"""`Bounds`: what an executor counts in flight and queued, and what it refuses.

One per executor (inside its `CallTracker`): the calls and units of work in
flight (`max_queue`) and the cost admitted and not started
(`max_queued_cost`), in total and by lane, counted exactly; `refusal` is
the admission rule, written once. Reporting the counts as metrics is
`_metrics.CallMetrics`'s job, not this one's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import NamedTuple, final

from ._errors import Overloaded
from ._lanes import Lane, Lanes


def cost_units(cost: float) -> int:
    """`cost` (a finite float >= 0) as an exact integer number of 2**-1074, the
    smallest float step: queued costs are summed in these, so they add and
    subtract without rounding and return to exactly 0 when nothing is queued."""
    numerator, denominator = cost.as_integer_ratio()
    return numerator << (_UNIT_BITS + 1 - denominator.bit_length())


_UNIT_BITS = 1074
_UNIT = 1 << _UNIT_BITS


def from_units(units: int) -> float:
    """`cost_units` back to a cost (correctly rounded)."""
    return units / _UNIT


@final
class Hold:
    """What an admitted unit of work (`Executor.admission`) holds: one place
    in flight, and the cost it was admitted with (at most its lane's share of
    `max_queued_cost`), which its calls take over as they are queued (so the
    same cost is never counted twice); once it is spent, its calls are
    counted as they are queued, like any call."""

    __slots__ = ("lane", "place", "units")

    def __init__(self, units: int, lane: Lane, place: bool) -> None:
        self.units = units
        self.lane = lane
        self.place = place


class _LaneCount:
    """One lane's counts and its shares of the bounds."""

    __slots__ = ("inflight", "share_calls", "share_units", "units")

    def __init__(self) -> None:
        self.units = 0  # cost queued, in `cost_units`
        self.inflight = 0  # calls and units of work in flight
        self.share_units: int | None = None
        self.share_calls: float | None = None


class Limits(NamedTuple):
    """An executor's bounds as set: `capacity`, the calls that run at once
    (`Strategy.capacity()`; `None`: no queue, so `max_queue` bounds nothing),
    `max_queue` and `max_queued_cost` (`None`: unbounded)."""

    capacity: int | None
    max_queue: int | None
    max_queued_cost: float | None


@final
class Bounds:
    """Counts calls in flight and the cost queued, in total and by lane, and
    refuses what `max_queue` and `max_queued_cost` do not admit (`refusal`).

    A call is in flight from admission until it finishes or is withdrawn; a
    running call whose caller went away still holds its worker, so it still
    counts. Its cost is *queued* from admission until it starts (or is
    withdrawn). Costs are summed exactly (`cost_units`). Thread-safe: calls
    move on worker threads and the loop's. `on_lane_cost(lane, cost)` is
    told each lane's queued cost as it changes, under the lock (a gauge).
    """

    def __init__(
        self,
        strategy: str,
        lanes: Lanes,
        limits: Limits,
        on_lane_cost: Callable[[Lane, float], None] | None = None,
    ) -> None:
        capacity, max_queue, max_queued_cost = limits
        self._strategy = strategy
        self._limit = None if max_queue is None or capacity is None else capacity + max_queue
        self._max_queue = max_queue
        self._max_cost = max_queued_cost
        self._max_units = None if max_queued_cost is None else cost_units(max_queued_cost)
        self._on_lane_cost = on_lane_cost
        self._inflight = 0
        self._units = 0
        self._lock = threading.Lock()
        self._lanes: dict[Lane, _LaneCount] = {}
        for lane in lanes.values():
            count = self._lanes[lane] = _LaneCount()
            fraction = lane.weight / lanes.total_weight
            if self._max_cost is not None:
                count.share_units = cost_units(self._max_cost * fraction)
            if self._limit is not None:
                count.share_calls = self._limit * fraction

    # ---- reading ---------------------------------------------------------------

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def queued_cost(self) -> float:
        return from_units(self._units)

    def lane_queued_cost(self, lane: Lane) -> float:
        return from_units(self._lanes[lane].units)

    def refusal(self, cost: float, lane: Lane) -> Overloaded | None:
        """The `Overloaded` a new unit of work of `cost` in `lane` would get
        now, or `None` if it would be admitted (`Executor.would_refuse`)."""
        count = self._lanes[lane]
        with self._lock:
            why = self._refuses(count, self._held_units(count, cost), whole=False)
            return None if why is None else self._overloaded(why, lane)

    def cost_to_admit(self, cost: float, lane: Lane) -> float | None:
        """How much queued cost must leave before a unit of work of `cost` in
        `lane` passes `max_queued_cost` by `_refuses`' rule (either the total
        or the lane's share gets room: the smaller excess); 0 when it would
        pass now, `None` without a cost bound. What a computed `Retry-After`
        waits for."""
        count = self._lanes[lane]
        bound, share = self._max_units, count.share_units
        if bound is None or share is None:
            return None
        with self._lock:
            units = self._held_units(count, cost)
            total_excess = self._units + units - bound
            lane_excess = count.units + units - share
        return from_units(max(0, min(total_excess, lane_excess)))

    # ---- the rule ----------------------------------------------------------------

    def _refuses(self, lane: _LaneCount, units: int, *, whole: bool) -> str | None:
        """Why `units` of cost (and one place) in `lane` would be refused now
        (`"calls"`, `"cost"`, or `None`), with the lock held: the admission rule.

        Each bound is shared by the lanes by weight: a lane's *share* is the
        bound × its weight / the sum of the executor's lanes' weights. A call
        of cost `c` in lane `L` is admitted when the total stays within the
        bound (`total + c <= bound`: a lane may borrow what the others leave
        unused) or when `L` stays within its share (`L's + min(c, share) <=
        share`: a lane under its share is never refused because others
        borrowed; a call costlier than its lane's whole share is admitted
        when its lane holds nothing). The same rule, with `c = 1`, applies to
        `max_queue`'s places in flight (capacity + `max_queue`). A unit of
        work is checked, and held, at `min(c, share)` (`whole=False`: the
        units given are that already); a call, at its whole cost."""
        limit = self._limit
        share_calls = lane.share_calls
        if (
            limit is not None
            and share_calls is not None
            and self._inflight + 1 > limit
            and lane.inflight + min(1.0, share_calls) > share_calls
        ):
            return "calls"
        bound = self._max_units
        share = lane.share_units
        if (
            bound is not None
            and share is not None
            and self._units + units > bound
            and lane.units + (min(units, share) if whole else units) > share
        ):
            return "cost"
        return None

    def _held_units(self, lane: _LaneCount, cost: float) -> int:
        units = cost_units(cost)
        share = lane.share_units
        return units if share is None else min(units, share)

    def _overloaded(self, why: str, named: Lane) -> Overloaded:
        """The error of a refusal for `why` in lane `named` (the message, built once)."""
        lane = self._lanes[named]
        if why == "cost":
            where = ""
            if lane.share_units is not None:
                where = (
                    f", lane {named.name!r} has {from_units(lane.units):g} of its share "
                    f"{from_units(lane.share_units):g}"
                )
            return Overloaded(
                f"{self._strategy} executor is full: {from_units(self._units):g} cost queued, "
                f"max_queued_cost={self._max_cost:g}{where}; try again later"
            )
        where = ""
        if lane.share_calls is not None:
            where = f", lane {named.name!r} has {lane.inflight} of its share {lane.share_calls:g}"
        return Overloaded(
            f"{self._strategy} executor is full: {self._inflight} calls in flight "
            f"(its workers' capacity plus max_queue={self._max_queue}){where}; try again later"
        )

    # ---- counting ------------------------------------------------------------------

    def _add(self, named: Lane, units: int) -> None:
        # With the lock held: `units` more (or fewer) cost queued in `named`.
        if units:
            lane = self._lanes[named]
            self._units += units
            lane.units += units
            if self._on_lane_cost is not None:
                self._on_lane_cost(named, from_units(lane.units))

    def admit(self, lane: Lane, cost: float, hold: Hold | None) -> Overloaded | None:
        """Count a call of `cost` in `lane` in, or return the `Overloaded` it
        gets (never when it belongs to an admitted unit of work, `hold`: the
        unit was admitted as a whole, and its held cost pays for the call's
        as far as it goes)."""
        count = self._lanes[lane]
        units = cost_units(cost)
        with self._lock:
            why = None if hold is not None else self._refuses(count, units, whole=True)
            if why is not None:
                return self._overloaded(why, lane)
            self._inflight += 1
            count.inflight += 1
            if hold is not None and hold.units:
                paid = min(hold.units, units)
                hold.units -= paid
                self._add(hold.lane, -paid)
            self._add(lane, units)
        return None

    def hold(self, cost: float, lane: Lane, *, refuse: bool = True) -> Hold | Overloaded:
        """Admit a unit of work of `cost` in `lane` (one place in flight, its
        cost queued, at most the lane's share of `max_queued_cost`), or
        return the `Overloaded` it gets (never with `refuse=False`)."""
        count = self._lanes[lane]
        units = self._held_units(count, cost)
        with self._lock:
            why = self._refuses(count, units, whole=False) if refuse else None
            if why is not None:
                return self._overloaded(why, lane)
            self._inflight += 1
            count.inflight += 1
            self._add(lane, units)
        return Hold(units, lane, place=True)

    def unhold(self, hold: Hold, *, place: bool = True) -> None:
        """Give back the cost `hold` still holds and, with `place`, its place
        (the unit of work is over)."""
        with self._lock:
            if place and hold.place:
                self._inflight -= 1
                self._lanes[hold.lane].inflight -= 1
                hold.place = False
            self._add(hold.lane, -hold.units)
            hold.units = 0

    def started(self, lane: Lane, cost: float) -> None:
        """A call of `cost` in `lane` started: its cost is no longer queued."""
        with self._lock:
            self._add(lane, -cost_units(cost))

    def out(self, lane: Lane, cost: float, *, queued: bool) -> None:
        """A call of `cost` in `lane` left the flight (and the queue, if `queued`)."""
        with self._lock:
            self._inflight -= 1
            self._lanes[lane].inflight -= 1
            if queued:
                self._add(lane, -cost_units(cost))
