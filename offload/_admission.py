"""Admission: what an executor counts, what it refuses, and what it holds.

`Limiter` is the one object (one per executor that counts, as anyio's
`CapacityLimiter` is the bound of `to_thread`): it counts the calls and
units of work in flight and the cost admitted and not started, in total and
by lane; refuses what `max_queue` and `max_queued_cost` do not admit (the
rule, once: `Limiter._refuses`); holds an admitted unit of work's place and
cost (`Admission`); and answers `would_refuse` and `cost_to_admit`. It tells
one `AdmissionListener` (the executor's metrics, `_metrics.CallMetrics`)
each move, and knows nothing of Prometheus. `Executor`'s admission methods
read it.
"""

from __future__ import annotations

import contextlib
import contextvars
from threading import Lock
from typing import Any, NamedTuple, Protocol, final

from ._call import Call
from ._errors import Overloaded
from ._lanes import Flow, Lane, Lanes
from ._metrics import function_label

# ---- the one unit of cost ------------------------------------------------------------
#
# A cost is a float in the callers' unit everywhere but inside `Limiter`'s
# sums, which count it as an exact integer number of 2**-1074 (the smallest
# float step), so they add and subtract without rounding and return to
# exactly 0 when nothing is queued.

_UNIT_BITS = 1074
_UNIT = 1 << _UNIT_BITS


def _units(cost: float) -> int:
    numerator, denominator = cost.as_integer_ratio()
    return numerator << (_UNIT_BITS + 1 - denominator.bit_length())


def _cost(units: int) -> float:
    return units / _UNIT  # correctly rounded


class Limits(NamedTuple):
    """An executor's bounds as set: `capacity`, the calls that run at once
    (`Strategy.capacity()`; `None`: no queue, so `max_queue` bounds nothing),
    `max_queue` and `max_queued_cost` (`None`: unbounded)."""

    capacity: int | None
    max_queue: int | None
    max_queued_cost: float | None


class AdmissionListener(Protocol):
    """What a `Limiter` tells as calls move (the executor's metrics). Called
    from any thread; `lane_cost` with the limiter's lock held."""

    def queued(self, call: Call[Any]) -> None: ...

    def unqueued(self, call: Call[Any]) -> None: ...

    def started(self, call: Call[Any]) -> None: ...

    def finished(self, call: Call[Any]) -> None: ...

    def withdrawn(self, call: Call[Any], reason: str) -> None: ...

    def refused(self, function: str, lane: Lane, reason: str) -> None: ...

    def lane_cost(self, lane: Lane, cost: float) -> None: ...

    def batch(self, calls: list[Call[Any]]) -> None: ...


@final
class Hold:
    """What an admitted unit of work holds: one place in flight, and the cost
    it was admitted with (at most its lane's share of `max_queued_cost`),
    which its calls take over as they are queued, so the same cost is never
    counted twice; with `keep`, the cost stays held until the unit ends, and
    pays for each of its calls (up to its whole cost) instead."""

    __slots__ = ("keep", "lane", "place", "units")

    def __init__(self, units: int, lane: Lane, place: bool, keep: bool = False) -> None:
        self.units = units
        self.lane = lane
        self.place = place
        self.keep = keep


class _LaneCount:
    """One lane's counts and its shares of the bounds."""

    __slots__ = ("inflight", "share_calls", "share_units", "units")

    def __init__(self) -> None:
        self.units = 0  # cost queued
        self.inflight = 0  # calls and units of work in flight
        self.share_units: int | None = None
        self.share_calls: float | None = None


@final
class Limiter:
    """One executor's admission: counts, refuses, holds. Thread-safe.

    A call is in flight from admission until it finishes or is withdrawn (a
    running call whose caller went away still holds its worker, so it still
    counts); its cost is *queued* from admission until it starts. It is the
    `_call.Tracker` of the calls it admits.
    """

    def __init__(
        self, strategy: str, lanes: Lanes, limits: Limits, listener: AdmissionListener | None = None
    ) -> None:
        capacity, max_queue, max_queued_cost = limits
        self._strategy = strategy
        self._listener = listener
        self._limit = None if max_queue is None or capacity is None else capacity + max_queue
        self._max_queue = max_queue
        self._max_cost = max_queued_cost
        self._max_units = None if max_queued_cost is None else _units(max_queued_cost)
        self._inflight = 0
        self._units = 0
        self._lock = Lock()
        self._lanes: dict[Lane, _LaneCount] = {}
        for lane in lanes.values():
            count = self._lanes[lane] = _LaneCount()
            fraction = lane.weight / lanes.total_weight
            if max_queued_cost is not None:
                count.share_units = _units(max_queued_cost * fraction)
            if self._limit is not None:
                count.share_calls = self._limit * fraction

    # ---- reading ---------------------------------------------------------------

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def queued_cost(self) -> float:
        return _cost(self._units)

    def lane_queued_cost(self, lane: Lane) -> float:
        return _cost(self._lanes[lane].units)

    def would_refuse(self, cost: float, lane: Lane) -> bool:
        """Whether a unit of work of `cost` in `lane` would be refused now
        (`Executor.would_refuse`): a snapshot that holds and counts nothing."""
        count = self._lanes[lane]
        with self._lock:
            return self._refuses(count, self._held_units(count, cost), whole=False) is not None

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
        return _cost(max(0, min(total_excess, lane_excess)))

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
        units = _units(cost)
        share = lane.share_units
        return units if share is None else min(units, share)

    def _overloaded(self, why: str, named: Lane) -> Overloaded:
        """The error of a refusal for `why` in lane `named` (the message, built once)."""
        lane = self._lanes[named]
        if why == "cost":
            where = ""
            if lane.share_units is not None:
                where = (
                    f", lane {named.name!r} has {_cost(lane.units):g} of its share "
                    f"{_cost(lane.share_units):g}"
                )
            return Overloaded(
                f"{self._strategy} executor is full: {_cost(self._units):g} cost queued, "
                f"max_queued_cost={self._max_cost:g}{where}; try again later"
            )
        where = ""
        if lane.share_calls is not None:
            where = f", lane {named.name!r} has {lane.inflight} of its share {lane.share_calls:g}"
        return Overloaded(
            f"{self._strategy} executor is full: {self._inflight} calls in flight "
            f"(its workers' capacity plus max_queue={self._max_queue}){where}; try again later"
        )

    def _refuse(self, why: str, lane: Lane, function: str) -> Overloaded:
        # Outside the lock: the error to raise, with the refusal counted.
        self.refused(function, "overloaded", lane)
        return self._overloaded(why, lane)

    # ---- counting ------------------------------------------------------------------

    def _add(self, named: Lane, units: int) -> None:
        # With the lock held: `units` more (or fewer) cost queued in `named`.
        if units:
            lane = self._lanes[named]
            self._units += units
            lane.units += units
            if self._listener is not None:
                self._listener.lane_cost(named, _cost(lane.units))

    def _out(self, call: Call[Any], *, queued: bool) -> None:
        with self._lock:
            self._inflight -= 1
            self._lanes[call.lane].inflight -= 1
            if queued:
                self._add(call.lane, -call.queued_units)

    def refused(self, function: str, reason: str, lane: Lane) -> None:
        """A call or unit of work was refused for `reason` (`overloaded`, `closed`)."""
        if self._listener is not None:
            self._listener.refused(function, lane, reason)

    # ---- calls ---------------------------------------------------------------------

    def admit(self, call: Call[Any], hold: Hold | None = None) -> None:
        """Count `call` in and become its tracker, or raise `Overloaded` before
        anything is done for it, counting the refusal. A call of an admitted
        unit of work (`hold`) is never refused (the unit was admitted as a
        whole), and its held cost pays for the call's as far as it goes
        (taken over from the hold, or, where the hold keeps its cost, left in it)."""
        lane = call.lane
        count = self._lanes[lane]
        units = _units(call.cost)
        with self._lock:
            why = None if hold is not None else self._refuses(count, units, whole=True)
            if why is None:
                self._inflight += 1
                count.inflight += 1
                if hold is not None and hold.units:
                    paid = min(hold.units, units)
                    if hold.keep:
                        units -= paid
                    else:
                        hold.units -= paid
                        self._add(hold.lane, -paid)
                self._add(lane, units)
                call.queued_units = units
        if why is not None:
            raise self._refuse(why, lane, function_label(call.fn))
        call.tracker = self
        if self._listener is not None:
            self._listener.queued(call)

    def unadmit(self, call: Call[Any]) -> None:
        """`call` was admitted but the strategy refused it (shutdown began)."""
        call.tracker = None
        self._out(call, queued=True)
        if self._listener is not None:
            self._listener.unqueued(call)

    def started(self, call: Call[Any]) -> None:
        with self._lock:
            self._add(call.lane, -call.queued_units)
        if self._listener is not None:
            self._listener.started(call)

    def finished(self, call: Call[Any]) -> None:
        # Not started: it failed before it could (no worker); its cost was still queued.
        self._out(call, queued=not call.started_at)
        if self._listener is not None:
            self._listener.finished(call)

    def withdrawn(self, call: Call[Any], reason: str) -> None:
        self._out(call, queued=True)
        if self._listener is not None:
            self._listener.withdrawn(call, reason)

    def batch(self, calls: list[Call[Any]]) -> None:
        """A batching strategy ran `calls` as one batch."""
        if calls and self._listener is not None:
            self._listener.batch(calls)

    # ---- units of work ----------------------------------------------------------------

    def hold(self, cost: float, lane: Lane, function: str, *, refuse: bool = True, keep: bool = False) -> Hold:
        """Admit a unit of work of `cost` in `lane` (one place in flight, its
        cost queued, at most the lane's share of `max_queued_cost`; with
        `keep`, until it ends), or raise `Overloaded`, counting the refusal
        under `function` (never with `refuse=False`)."""
        count = self._lanes[lane]
        units = self._held_units(count, cost)
        with self._lock:
            why = self._refuses(count, units, whole=False) if refuse else None
            if why is None:
                self._inflight += 1
                count.inflight += 1
                self._add(lane, units)
        if why is not None:
            raise self._refuse(why, lane, function)
        return Hold(units, lane, place=True, keep=keep)

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


def count_batch(calls: list[Call[Any]]) -> None:
    """For strategies: `calls` ran together as one batch (`offload_batch_size`)."""
    if calls and isinstance(calls[0].tracker, Limiter):
        calls[0].tracker.batch(calls)


@final
class Admission:
    """An admitted unit of work (`Executor.admission`): the place it holds,
    its cost, and the flow its calls share."""

    __slots__ = ("_hold", "_limiter", "_owner", "flow")

    def __init__(self, owner: object, limiter: Limiter | None, hold: Hold | None, flow: Flow) -> None:
        self._owner = owner
        self._limiter = limiter
        self._hold = hold
        #: The flow the block's calls share (one fair share of `lane`).
        self.flow = flow

    @property
    def lane(self) -> Lane:
        """The lane it was admitted to."""
        return self.flow.lane

    def release_cost(self) -> None:
        """Give back the cost the unit still holds (what its calls have not
        taken over), keeping its place in flight: its priced work is over,
        wherever it ran (work done on the event loop makes no call that
        would take the held cost over). Calls made later in the block are
        counted as they are queued, like any call. Idempotent."""
        hold = self._hold
        if hold is not None and self._limiter is not None:
            self._limiter.unhold(hold, place=False)

    def release(self) -> None:
        """Give the place and the unspent cost back now (idempotent); calls
        made later in the block are still admitted, and still share its flow."""
        hold, self._hold = self._hold, None
        if hold is not None and self._limiter is not None:
            self._limiter.unhold(hold)


# The admission block the current task is in (`Executor.admission`).
_current: contextvars.ContextVar[Admission | None] = contextvars.ContextVar(
    "offload_admitted", default=None
)


def enter(admission: Admission) -> contextvars.Token[Admission | None]:
    """Make `admission` the current task's admission block (undo with `leave`)."""
    return _current.set(admission)


def leave(token: contextvars.Token[Admission | None]) -> None:
    """Undo `enter`. A block ended in another context than the one it was
    entered in (a server that holds a request's admission until its answer
    is sent, past the task that served it) leaves that context as it is: a
    call made there later finds the block released, and is admitted as a
    released block's calls are."""
    with contextlib.suppress(ValueError):
        _current.reset(token)


def current_admission(owner: object) -> Admission | None:
    """The admission block of `owner` (an executor) the current task is in;
    `None` outside one."""
    admission = _current.get()
    if admission is None or admission._owner is not owner:
        return None
    return admission


def calls_hold(admission: Admission) -> Hold:
    """What the calls of `admission`'s block are paid from."""
    hold = admission._hold
    if hold is None:
        # Released, or made with no limiter: its calls are still admitted.
        hold = admission._hold = Hold(0, admission.flow.lane, place=False)
    return hold
