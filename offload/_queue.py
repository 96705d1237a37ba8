"""`CallQueue`: the order in which queued calls reach workers.

Every queuing strategy keeps its waiting calls in one of these (through
`Dispatcher`, or directly), so the discipline is the same everywhere:

- **Lanes, by weight.** Each lane (`Lane`: a name and a weight) has a
  virtual clock that advances by `cost / weight` whenever one of its calls is
  served; the lane with the lowest clock goes next. A lane that was empty
  joins at the lowest clock among the busy ones: it gets its share from now
  on, never credit for the time it was idle. Two backlogged lanes of weights
  4 and 1 get 4/5 and 1/5 of the calls' cost.
- **Flows, by cost, within a lane.** A flow (`Flow`: say, the calls of one
  server request) is served in arrival order, and flows share their lane by
  self-clocked fair queuing: when a call reaches the head of its flow it is
  stamped `finish = max(lane clock, flow's last finish) + cost`, and the
  smallest finish goes first; the lane clock is the finish of the call served
  last. A newcomer is stamped from the lane clock, so a small call goes
  ahead of the large pieces of other flows' backlogs: it waits for the calls
  already running and at most about one call's cost of others, never for
  another flow's backlog. A large call is not starved: each small call served
  moves the clock forward, until the large one's finish is the smallest.
- **No flow: a flow of its own.** With equal costs and no flows, this is
  first in, first out.

First-in, first-out over everything is one shared flow: that is how an
`Executor(scheduling="fifo")` gets it.

Not thread-safe: the owner (a `Dispatcher`, a strategy) holds its lock.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, final

from ._call import PENDING, Call
from ._errors import ConfigError

DEFAULT_LANE_NAME = "default"


def check_cost(cost: object, *, source: str = "cost") -> float:
    """Validate a call's cost: a finite number >= 0 (not a `bool`)."""
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not 0 <= cost < math.inf:
        raise ConfigError(f"{source} must be a finite number >= 0, got {cost!r}")
    return float(cost)


@final
class Lane:
    """A named share of an executor's workers (`Executor(lanes={name: weight})`).

    Backlogged lanes share the workers in proportion to their weights, by
    the cost of the calls served. Immutable; compared by identity.
    """

    __slots__ = ("name", "weight")

    def __init__(self, name: str, weight: float = 1.0) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a lane name must be a non-empty string, got {name!r}")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < math.inf:
            raise ConfigError(f"lane {name!r}: the weight must be a finite number > 0, got {weight!r}")
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

    __slots__ = ("_calls", "_finish", "_queue", "lane")

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        # Scheduling state, valid for the queue that set it (a queue made after
        # a fork must not inherit a finish tag from its parent's queue).
        self._queue: object = None
        self._finish = 0.0
        self._calls: deque[Call[Any]] = deque()

    def __repr__(self) -> str:
        return f"<Flow lane={self.lane.name!r} queued={len(self._calls)}>"


# A lane's heap entry: (finish tag, arrival number, a call that is its own
# flow or a flow whose head call carries that tag).
_Entry = tuple[float, int, Call[Any] | Flow]


@final
class _LaneState:
    __slots__ = ("clock", "heap", "lane", "served")

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.heap: list[_Entry] = []
        self.clock = 0.0  # the finish tag of the call served last (flows' virtual time)
        self.served = 0.0  # cost served / weight (the lanes' virtual time)


@final
class CallQueue:
    """Queued calls, served fairly by lane, flow and cost (see the module docstring).

    `push` and `pop` cost O(log n) in the calls queued, plus a scan of the
    busy lanes (a handful). Calls withdrawn while queued (cancelled, dropped,
    deadline passed) stay until `pop` reaches them, which skips them without
    charging their cost.
    """

    def __init__(self, default_lane: Lane | None = None) -> None:
        self._default = default_lane or Lane(DEFAULT_LANE_NAME)
        # By name: the executor's lane objects, and `None` for the default one.
        self._lanes: dict[str, _LaneState] = {}
        self._busy: list[_LaneState] = []  # lanes with queued calls, in the order they became busy
        self._arrivals = itertools.count()
        self._length = 0

    def __len__(self) -> int:
        """Calls in the queue (withdrawn ones included until `pop` reaches them)."""
        return self._length

    def push(self, call: Call[Any]) -> None:
        flow = call.flow
        lane = flow.lane if flow is not None else (call.lane or self._default)
        state = self._lanes.get(lane.name)
        if state is None:
            state = self._lanes[lane.name] = _LaneState(lane)
        state.lane = lane
        if not state.heap:
            # Joins at the lowest virtual time among the busy lanes: its share
            # from now on, no credit for its idle time.
            if self._busy:
                state.served = max(state.served, min(s.served for s in self._busy))
            else:
                state.served = max(state.served, 0.0)
            self._busy.append(state)
        if flow is None:
            heapq.heappush(state.heap, (state.clock + call.cost, next(self._arrivals), call))
        else:
            if flow._queue is not self:
                flow._queue, flow._finish, flow._calls = self, 0.0, deque()
            flow._calls.append(call)
            if len(flow._calls) == 1:
                self._stamp(state, flow, max(state.clock, flow._finish))
        self._length += 1

    def _stamp(self, state: _LaneState, flow: Flow, start: float) -> None:
        head = flow._calls[0]
        heapq.heappush(state.heap, (start + head.cost, next(self._arrivals), flow))

    def pop(self) -> Call[Any] | None:
        """The next call to run, or `None` if none is queued. Skips (and
        forgets) withdrawn calls."""
        while self._busy:
            state = min(self._busy, key=_served)  # ties: the lane busy longest
            finish, _, item = heapq.heappop(state.heap)
            if isinstance(item, Flow):
                call = item._calls.popleft()
                item._finish = finish
                if item._calls:
                    self._stamp(state, item, finish)
            else:
                call = item
            self._length -= 1
            if not state.heap:
                self._busy.remove(state)
            if call.state is not PENDING:
                continue  # withdrawn while queued: costs nothing
            state.clock = max(state.clock, finish)
            state.served += call.cost / state.lane.weight
            return call
        return None

    def drain(self) -> list[Call[Any]]:
        """Remove and return every queued call (withdrawn ones included)."""
        calls = list(self)
        for state in self._busy:
            for _, _, item in state.heap:
                if isinstance(item, Flow):
                    item._calls = deque()
            state.heap = []
        self._busy.clear()
        self._length = 0
        return calls

    def __iter__(self) -> Iterator[Call[Any]]:
        """The queued calls, in no particular order."""
        for state in self._busy:
            for _, _, item in state.heap:
                if isinstance(item, Flow):
                    yield from item._calls
                else:
                    yield item

    def take(self, match: Callable[[Call[Any]], bool], limit: int) -> list[Call[Any]]:
        """Remove and return up to `limit` pending calls for which `match` is
        true: calls that are their own flow, and each flow's calls from its
        head on, as long as they match (a flow is never served out of order).

        For a strategy that runs several calls together (a batch joins its
        head): the calls leave without moving any clock, as a batch costs
        its head's share."""
        taken: list[Call[Any]] = []
        for state in list(self._busy):
            if len(taken) >= limit:
                break
            kept: list[_Entry] = []
            for entry in sorted(state.heap):
                item = entry[2]
                if isinstance(item, Flow):
                    calls = item._calls
                    head = calls[0]
                    while calls and len(taken) < limit and (
                        calls[0].state is not PENDING or match(calls[0])
                    ):
                        call = calls.popleft()
                        self._length -= 1
                        if call.state is PENDING:
                            taken.append(call)
                    if calls:
                        # The tag is its head's finish: restamp for a new head.
                        kept.append((entry[0] - head.cost + calls[0].cost, entry[1], item))
                elif len(taken) < limit and item.state is PENDING and match(item):
                    taken.append(item)
                    self._length -= 1
                else:
                    kept.append(entry)
            heapq.heapify(kept)
            state.heap = kept
            if not kept:
                self._busy.remove(state)
        return taken


def _served(state: _LaneState) -> float:
    return state.served
