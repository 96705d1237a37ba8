"""Admission as the executor offers it: `ExecutorAdmission`, `Executor`'s
methods (the `admission()` block and the hints that tell what admission
would do now), and `Admission`, a unit of work made of several calls (a
server request), admitted once, with the block of code it covers. The rule
that admits or refuses is `_bounds.Bounds._refuses`."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import final

from ._bounds import Bounds, Hold
from ._checks import check_cost
from ._lanes import Flow, Lanes
from ._tracker import CallTracker


@final
class Admission:
    """An admitted unit of work (`Executor.admission`): the place it holds,
    its cost, and the flow its calls share."""

    __slots__ = ("_bounds", "_hold", "_owner", "flow", "lane")

    def __init__(self, owner: object, bounds: Bounds | None, hold: Hold | None, flow: Flow) -> None:
        self._owner = owner
        self._bounds = bounds
        self._hold = hold
        #: The flow the block's calls share (one fair share of `lane`).
        self.flow = flow
        #: The lane it was admitted to.
        self.lane = flow.lane.name

    def release_cost(self) -> None:
        """Give back the cost the unit still holds (what its calls have not
        taken over), keeping its place in flight: its priced work is over,
        wherever it ran (work done on the event loop makes no call that
        would take the held cost over). Calls made later in the block are
        counted as they are queued, like any call. Idempotent."""
        hold = self._hold
        if hold is not None and self._bounds is not None:
            self._bounds.unhold(hold, place=False)

    def release(self) -> None:
        """Give the place and the unspent cost back now (idempotent); calls
        made later in the block are still admitted, and still share its flow."""
        hold, self._hold = self._hold, None
        if hold is not None and self._bounds is not None:
            self._bounds.unhold(hold)


# The admission block the current task is in (`Executor.admission`).
_current: contextvars.ContextVar[Admission | None] = contextvars.ContextVar(
    "offload_admitted", default=None
)


def enter(admission: Admission) -> contextvars.Token[Admission | None]:
    """Make `admission` the current task's admission block (undo with `leave`)."""
    return _current.set(admission)


def leave(token: contextvars.Token[Admission | None]) -> None:
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
        # Released, or made with no tracker: its calls are still admitted.
        hold = admission._hold = Hold(0, admission.flow.lane, place=False)
    return hold


class ExecutorAdmission:
    """`Executor`'s admission methods: the `admission()` block and the hints
    that say what admission would do now, read from the executor's bounds
    (none are kept where the executor counts nothing)."""

    _tracker: CallTracker | None
    _lanes: Lanes

    @property
    def overloaded(self) -> bool:
        """True when a unit of work of cost 1 in the default lane would fail
        with `Overloaded` now (`would_refuse` for another cost or lane). A
        hint for refusing work early, not a reservation: another caller may
        take the last place first."""
        tracker = self._tracker
        return tracker is not None and tracker.bounds.refusal(1.0, self._lanes.default) is not None

    @property
    def in_flight(self) -> int:
        """Calls and `admission()` units in flight now (what `max_queue`
        bounds, with capacity). Counted only where the executor counts
        (`max_queue` or `max_queued_cost` set, or metrics on); else 0."""
        tracker = self._tracker
        return 0 if tracker is None else tracker.bounds.inflight

    @property
    def queued_cost(self) -> float:
        """The cost admitted and not started now, in all lanes (what
        `max_queued_cost` bounds): held by `admission()` units, of calls
        queued. Counted only where the executor counts (as `in_flight`); else 0."""
        tracker = self._tracker
        return 0.0 if tracker is None else tracker.bounds.queued_cost

    def lane_queued_cost(self, lane: str) -> float:
        """`queued_cost` of one lane (by name; `ConfigError` for an unknown one)."""
        chosen = self._lanes.lane(lane)
        tracker = self._tracker
        return 0.0 if tracker is None else tracker.bounds.lane_queued_cost(chosen)

    def cost_to_admit(self, *, cost: float = 1.0, lane: str | None = None) -> float | None:
        """How much queued cost must leave (start, or be withdrawn) before
        `admission(cost=cost, lane=lane)` passes `max_queued_cost`, by the
        same rule as `would_refuse`: 0 when it would pass now, `None` where
        no cost bound is set. A snapshot, like `would_refuse`. Raises
        `ConfigError` for a bad cost or an unknown lane."""
        cost = check_cost(cost)
        chosen = self._lanes.lane(lane)
        tracker = self._tracker
        return None if tracker is None else tracker.bounds.cost_to_admit(cost, chosen)

    def would_refuse(self, *, cost: float = 1.0, lane: str | None = None) -> bool:
        """True when `admission(cost=cost, lane=lane)` would raise `Overloaded`
        now (by the per-lane rule: docs/lanes.md, "Admission by cost").
        Like `overloaded`, a hint that reserves nothing and counts no
        refusal. Raises `ConfigError` for a bad cost or an unknown lane."""
        cost = check_cost(cost)
        chosen = self._lanes.lane(lane)
        tracker = self._tracker
        return tracker is not None and tracker.bounds.refusal(cost, chosen) is not None

    @contextlib.contextmanager
    def admission(
        self, function: str, *, cost: float = 1.0, lane: str | None = None, refuse: bool = True
    ) -> Iterator[Admission]:
        """Admission for a unit of work made of several calls (a server request).

        **The bounds.** With `max_queue`, a call that would make more than
        `max_queue` calls wait for a worker (more than capacity +
        `max_queue` in flight) fails at once with `Overloaded`, before
        anything is done for it. With `max_queued_cost`, so does a call (or
        an `admission()` unit) that would bring the cost admitted and not
        started above it. Both bounds are shared by the lanes by weight, so
        that a lane that fills the queue cannot lock the others out, and a
        call costlier than its lane's whole share runs rather than being
        refused forever: the exact rule is on docs/lanes.md ("Admission by
        cost") and on the method that applies it
        (`offload._bounds.Bounds._refuses`). An `admission()` unit is
        checked once and never refused halfway.

        On entry, raises `Overloaded` if a call of `cost` made now would be
        refused (a cost above `lane`'s share of `max_queued_cost` is checked
        as that share), counting the refusal in
        `offload_rejected_calls{function=function}` (and by lane): check it
        before parsing or rendering anything. Once admitted, the unit holds
        one place in flight and its `cost` (at most that share), as a queued
        call would, until the block ends or `release()` is called on what the
        block yields, so a burst of requests that arrive together cannot all
        pass the check before any of them has queued a call. Its calls take
        the held cost over as they are queued (a call's own cost is set with
        `options(cost=)`), so it is never counted twice; once it is spent,
        they are counted as they are queued and started, as any call.

        Inside the block (this task, and tasks it starts, which copy its
        `contextvars`), calls on this executor are admitted without a further
        check, so an admitted request is never refused halfway, and they form
        one flow of `lane`: queued behind each other, interleaved fairly with
        other flows. A nested `admission()` is a unit of its own (its own
        place, cost and flow).

        `refuse=False`: admit whatever the bounds (work that must not be
        refused, such as an offline batch); it still holds its place and cost.
        Raises `ConfigError` for an unknown lane or a bad cost.
        """
        cost = check_cost(cost)
        chosen = self._lanes.lane(lane)
        tracker = self._tracker
        hold = None if tracker is None else tracker.hold(cost, chosen, function, refuse=refuse)
        admission = Admission(self, None if tracker is None else tracker.bounds, hold, Flow(chosen))
        token = enter(admission)
        try:
            yield admission
        finally:
            leave(token)
            admission.release()
