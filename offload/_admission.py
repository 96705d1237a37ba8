"""Admission control: what an executor admits, holds and refuses.

A `CallTracker` per executor counts the calls in flight (`max_queue`) and the
cost queued (`max_queued_cost`), in total and by lane, exactly; it refuses
what the bounds do not admit (`Overloaded`) and tells the metrics
(`_metrics.py`) of every call's moves.
"""

from __future__ import annotations

import threading
from typing import Any, final

from ._call import Call
from ._errors import ConfigError, Overloaded, WorkerCrashed
from ._lanes import Lane, Lanes
from ._metrics import _Children, _Families, function_label


def cost_units(cost: float) -> int:
    """`cost` (a finite float >= 0) as an exact integer number of 2**-1074, the
    smallest float step: queued costs are summed in these, so they add and
    subtract without rounding and return to exactly 0 when nothing is queued."""
    numerator, denominator = cost.as_integer_ratio()
    return numerator << (_UNIT_BITS + 1 - denominator.bit_length())


_UNIT_BITS = 1074
_UNIT = 1 << _UNIT_BITS


def _from_units(units: int) -> float:
    return units / _UNIT  # correctly rounded


class _LaneChildren:
    """One (strategy, lane)'s metric children, what it holds, and its shares."""

    __slots__ = ("closed", "inflight", "overloaded", "queue_wait", "queued_cost", "share_calls", "share_units", "units")

    def __init__(self, families: _Families | None, strategy: str, lane: str) -> None:
        self.units = 0  # cost queued, in `cost_units`
        self.inflight = 0  # calls and units of work in flight
        # Its weighted shares of `max_queued_cost` and of the places in flight (set by the tracker).
        self.share_units: int | None = None
        self.share_calls: float | None = None
        if families is None:
            self.queued_cost = self.queue_wait = self.overloaded = self.closed = None
            return
        self.queued_cost = families.lane_queued_cost.labels(strategy, lane)
        self.queue_wait = families.lane_queue_wait.labels(strategy, lane)
        self.overloaded = families.lane_rejected.labels(strategy, lane, "overloaded")
        self.closed = families.lane_rejected.labels(strategy, lane, "closed")


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


@final
class CallTracker:
    """Per executor: counts calls in flight (for `max_queue`) and the cost
    queued (for `max_queued_cost`), in total and by lane, and feeds the metrics.

    A call is in flight from admission until it finishes or is withdrawn; a
    running call whose caller went away still holds its worker, so it still
    counts. Its cost is *queued* from admission until it starts (or is
    withdrawn). Costs are summed exactly (`cost_units`).

    Each bound is shared by the lanes by weight: a lane's *share* is the
    bound × its weight / the sum of the executor's lanes' weights. A call of
    cost `c` in lane `L` is admitted when the total stays within the bound
    (`total + c <= bound`: a lane may borrow what the others leave unused) or
    when `L` stays within its share (`L's + min(c, share) <= share`: a lane
    under its share is never refused because others borrowed; a call
    costlier than its lane's whole share is admitted when its lane holds
    nothing). The same rule, with `c = 1`, applies to `max_queue`'s places
    in flight. A unit of work (`hold`) is checked and held at
    `min(c, share)`. Thread-safe: calls move on worker threads and the loop's.
    """

    def __init__(
        self,
        strategy: str,
        capacity: int | None,
        max_queue: int | None,
        max_queued_cost: float | None,
        metrics: bool,
        lanes: Lanes,
    ) -> None:
        self._strategy = strategy
        self._limit = None if max_queue is None or capacity is None else capacity + max_queue
        self._max_queue = max_queue
        self._max_cost = max_queued_cost
        self._max_units = None if max_queued_cost is None else cost_units(max_queued_cost)
        self._inflight = 0
        self._units = 0
        self._lock = threading.Lock()
        self._families = _Families.get() if metrics else None
        self._children: dict[str, _Children] = {}
        # By the executor's own `Lane` objects, each with its shares of the bounds.
        self._lanes: dict[Lane, _LaneChildren] = {}
        for lane in lanes.values():
            counts = self._lanes[lane] = _LaneChildren(self._families, strategy, lane.name)
            fraction = lane.weight / lanes.total_weight
            if self._max_cost is not None:
                counts.share_units = cost_units(self._max_cost * fraction)
            if self._limit is not None:
                counts.share_calls = self._limit * fraction

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def queued_cost(self) -> float:
        return _from_units(self._units)

    def lane_queued_cost(self, lane: Lane) -> float:
        return _from_units(self._lanes[lane].units)

    @property
    def full(self) -> bool:
        return self._limit is not None and self._inflight >= self._limit

    def _labels(self, call: Call[Any]) -> _Children | None:
        children: _Children | None = call.metrics
        if children is not None:
            return children
        families = self._families
        if families is None:
            return None
        name = function_label(call.fn)
        children = self._children.get(name)
        if children is None:
            children = self._children.setdefault(name, _Children(families, self._strategy, name))
        call.metrics = children
        return children

    def _lane(self, lane: Lane) -> _LaneChildren:
        return self._lanes[lane]

    def _refuses_units(self, lane: _LaneChildren, units: int, *, whole: bool) -> str | None:
        """Why `units` of cost (and one place) in `lane` would be refused now
        (with the lock held). `whole`: the cost is charged in full (a call);
        else it is already at most the lane's share (a unit's hold)."""
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

    def _held_units(self, lane: _LaneChildren, cost: float) -> int:
        units = cost_units(cost)
        share = lane.share_units
        return units if share is None else min(units, share)

    def _refuses(self, cost: float, lane: Lane) -> str | None:
        """Why a new unit of work of `cost` in `lane` would be refused now:
        `"calls"`, `"cost"`, or `None`."""
        children = self._lane(lane)
        with self._lock:
            return self._refuses_units(children, self._held_units(children, cost), whole=False)

    def _add(self, lane: _LaneChildren, units: int) -> None:
        # With the lock held: `units` more (or fewer) cost queued in `lane`.
        if units:
            self._units += units
            lane.units += units
            if lane.queued_cost is not None:
                lane.queued_cost.set(_from_units(lane.units))

    def admit(self, call: Call[Any], hold: Hold | None = None) -> None:
        """Count `call` in, or raise `Overloaded` before anything is done for
        it (never when it belongs to an admitted unit of work, `hold`: the
        unit was admitted as a whole, and its held cost pays for the call's
        as far as it goes)."""
        lane = self._lane(call.lane)
        units = cost_units(call.cost)
        with self._lock:
            why = None if hold is not None else self._refuses_units(lane, units, whole=True)
            if why is None:
                self._inflight += 1
                lane.inflight += 1
                if hold is not None and hold.units:
                    paid = min(hold.units, units)
                    hold.units -= paid
                    self._add(self._lane(hold.lane), -paid)
                self._add(lane, units)
        if why is not None:
            self._refused(function_label(call.fn), lane)
            raise self._overloaded(why, call.lane)
        call.tracker = self
        children = self._labels(call)
        if children is not None:
            children.queued.inc()

    def hold(self, cost: float, lane: Lane, function: str, *, refuse: bool = True) -> Hold:
        """Admit a unit of work of `cost` in `lane` (one place in flight, its
        cost queued, at most the lane's share of `max_queued_cost`), or raise
        `Overloaded`, counting the refusal (never with `refuse=False`)."""
        children = self._lane(lane)
        units = self._held_units(children, cost)
        with self._lock:
            why = self._refuses_units(children, units, whole=False) if refuse else None
            if why is None:
                self._inflight += 1
                children.inflight += 1
                self._add(children, units)
        if why is not None:
            self._refused(function, children)
            raise self._overloaded(why, lane)
        return Hold(units, lane, place=True)

    def unhold(self, hold: Hold) -> None:
        """The unit of work is over: give back its place and the cost its calls did not take."""
        lane = self._lane(hold.lane)
        with self._lock:
            if hold.place:
                self._inflight -= 1
                lane.inflight -= 1
                hold.place = False
            self._add(lane, -hold.units)
            hold.units = 0

    def unhold_cost(self, hold: Hold) -> None:
        """Give back the cost `hold` still holds, keeping its place."""
        lane = self._lane(hold.lane)
        with self._lock:
            self._add(lane, -hold.units)
            hold.units = 0

    def _out(self, call: Call[Any], *, queued: bool) -> None:
        # With the lock held: `call` leaves the flight (and the queue, if `queued`).
        lane = self._lane(call.lane)
        self._inflight -= 1
        lane.inflight -= 1
        if queued:
            self._add(lane, -cost_units(call.cost))

    def unadmit(self, call: Call[Any]) -> None:
        """`call` was admitted but the strategy refused it (shutdown began)."""
        call.tracker = None
        with self._lock:
            self._out(call, queued=True)
        children = self._labels(call)
        if children is not None:
            children.queued.dec()

    def _overloaded(self, why: str, named: Lane) -> Overloaded:
        """The error of a refusal for `why` (`"calls"`, `"cost"`) in lane `named`."""
        lane = self._lane(named)
        name = named.name
        if why == "cost":
            where = ""
            if lane.share_units is not None:
                where = (
                    f", lane {name!r} has {_from_units(lane.units):g} of its share "
                    f"{_from_units(lane.share_units):g}"
                )
            return Overloaded(
                f"{self._strategy} executor is full: {_from_units(self._units):g} cost queued, "
                f"max_queued_cost={self._max_cost:g}{where}; try again later"
            )
        where = ""
        if lane.share_calls is not None:
            where = f", lane {name!r} has {lane.inflight} of its share {lane.share_calls:g}"
        return Overloaded(
            f"{self._strategy} executor is full: {self._inflight} calls in flight "
            f"(its workers' capacity plus max_queue={self._max_queue}){where}; try again later"
        )

    def _refused(self, function: str, lane: _LaneChildren, reason: str = "overloaded") -> None:
        if self._families is not None:
            self._families.rejected.labels(self._strategy, function, reason).inc()
            counter = lane.overloaded if reason == "overloaded" else lane.closed
            if counter is not None:
                counter.inc()

    def rejected(self, function: str, reason: str, lane: Lane) -> None:
        """A call or unit of work was refused for `reason` (`overloaded`, `closed`)."""
        self._refused(function, self._lane(lane), reason)

    def started(self, call: Call[Any]) -> None:
        lane = self._lane(call.lane)
        with self._lock:
            self._add(lane, -cost_units(call.cost))
        if lane.queue_wait is not None:
            lane.queue_wait.observe(call.started_at - call.queued_at)
        children = self._labels(call)
        if children is not None:
            children.queued.dec()
            children.running.inc()
            children.queue_wait.observe(call.started_at - call.queued_at)

    def finished(self, call: Call[Any]) -> None:
        started = bool(call.started_at)
        with self._lock:
            # Not started: it failed before it could (no worker); its cost was still queued.
            self._out(call, queued=not started)
        children = self._labels(call)
        if children is not None:
            if started:
                children.running.dec()
                children.run_time.observe(call.finished_at - call.started_at)
            else:
                children.queued.dec()
            if call.stopped_by is not None:
                # offload killed its worker on purpose: not a crash.
                children.dropped[call.stopped_by].inc()
            elif isinstance(call.error, WorkerCrashed):
                children.crashed.inc()

    def withdrawn(self, call: Call[Any], reason: str) -> None:
        with self._lock:
            self._out(call, queued=True)
        children = self._labels(call)
        if children is not None:
            children.queued.dec()
            children.dropped[reason].inc()

    def batch(self, calls: list[Call[Any]]) -> None:
        """A batching strategy ran `calls` as one batch."""
        if calls:
            children = self._labels(calls[0])
            if children is not None:
                children.batch_size.observe(len(calls))


def check_max_queue(value: object) -> int | None:
    """Validate `max_queue`: `None` (unbounded) or an `int` >= 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"max_queue must be None (unbounded) or an integer >= 0, got {value!r}")
    return value


def check_max_queued_cost(value: object) -> float | None:
    """Validate `max_queued_cost`: `None` (unbounded) or a number > 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ConfigError(
            f"max_queued_cost must be None (unbounded) or a finite number > 0, got {value!r}"
        )
    return float(value)


def count_batch(calls: list[Call[Any]]) -> None:
    """For strategies: `calls` ran together as one batch (`offload_batch_size`)."""
    if calls and calls[0].tracker is not None:
        tracker = calls[0].tracker
        if isinstance(tracker, CallTracker):
            tracker.batch(calls)
