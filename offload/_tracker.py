"""`CallTracker`: what an executor attaches to its calls (`Call.tracker`).

Each move of a call (admitted, started, finished, withdrawn) goes to the
executor's `Bounds` (counting and refusing, `_bounds.py`) and, with metrics
on, to its `CallMetrics` (`_metrics.py`): the two stay apart, this joins
them behind the `_call.Tracker` protocol.
"""

from __future__ import annotations

from typing import Any, final

from ._bounds import Bounds, Hold, Limits
from ._call import Call
from ._errors import Overloaded
from ._lanes import Lane, Lanes
from ._metrics import CallMetrics, _Families, function_label


@final
class CallTracker:
    """Per executor: its `Bounds`, and its `CallMetrics` when metrics are on
    (`metrics=False` or no `prometheus_client`: none). Thread-safe."""

    def __init__(
        self,
        strategy: str,
        lanes: Lanes,
        limits: Limits,
        *,
        metrics: bool,
    ) -> None:
        families = _Families.get() if metrics else None
        self.metrics = None if families is None else CallMetrics(families, strategy, lanes)
        self.bounds = Bounds(
            strategy, lanes, limits, on_lane_cost=None if self.metrics is None else self.metrics.lane_cost
        )

    # ---- the executor's ------------------------------------------------------------

    def admit(self, call: Call[Any], hold: Hold | None = None) -> None:
        """Count `call` in, or raise `Overloaded` before anything is done for
        it, counting the refusal (never when it belongs to an admitted unit of
        work, `hold`: see `Bounds.admit`)."""
        refused = self.bounds.admit(call.lane, call.cost, hold)
        if refused is not None:
            self.rejected(function_label(call.fn), "overloaded", call.lane)
            raise refused
        call.tracker = self
        if self.metrics is not None:
            self.metrics.queued(call)

    def unadmit(self, call: Call[Any]) -> None:
        """`call` was admitted but the strategy refused it (shutdown began)."""
        call.tracker = None
        self.bounds.out(call.lane, call.cost, queued=True)
        if self.metrics is not None:
            self.metrics.unqueued(call)

    def hold(self, cost: float, lane: Lane, function: str, *, refuse: bool = True) -> Hold:
        """Admit a unit of work (`Bounds.hold`), or raise `Overloaded`,
        counting the refusal under `function`."""
        held = self.bounds.hold(cost, lane, refuse=refuse)
        if isinstance(held, Overloaded):
            self.rejected(function, "overloaded", lane)
            raise held
        return held

    def rejected(self, function: str, reason: str, lane: Lane) -> None:
        """A call or unit of work was refused for `reason` (`overloaded`, `closed`)."""
        if self.metrics is not None:
            self.metrics.refused(function, lane, reason)

    # ---- the calls' (`_call.Tracker`) ----------------------------------------------------

    def started(self, call: Call[Any]) -> None:
        self.bounds.started(call.lane, call.cost)
        if self.metrics is not None:
            self.metrics.started(call)

    def finished(self, call: Call[Any]) -> None:
        # Not started: it failed before it could (no worker); its cost was still queued.
        self.bounds.out(call.lane, call.cost, queued=not call.started_at)
        if self.metrics is not None:
            self.metrics.finished(call)

    def withdrawn(self, call: Call[Any], reason: str) -> None:
        self.bounds.out(call.lane, call.cost, queued=True)
        if self.metrics is not None:
            self.metrics.withdrawn(call, reason)

    def batch(self, calls: list[Call[Any]]) -> None:
        """A batching strategy ran `calls` as one batch."""
        if calls and self.metrics is not None:
            self.metrics.batch(calls)


def count_batch(calls: list[Call[Any]]) -> None:
    """For strategies: `calls` ran together as one batch (`offload_batch_size`)."""
    if calls and calls[0].tracker is not None:
        tracker = calls[0].tracker
        if isinstance(tracker, CallTracker):
            tracker.batch(calls)
