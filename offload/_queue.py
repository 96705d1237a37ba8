"""`CallQueue`: the order in which queued calls reach workers.

Every queuing strategy keeps its waiting calls in one of these (through
`Dispatcher`, or directly), so the discipline is the same everywhere:

- **Lanes, by weight.** Each lane (`Lane`: a name and a weight) has a
  virtual time that advances by `cost / weight` whenever one of its calls is
  served; the lane with the lowest virtual time goes next. A lane that was
  empty joins at the lowest virtual time among the busy ones (or at its own,
  if that is higher: a lane that leaves and comes back at once does not skip
  ahead). When the queue is empty, every lane's virtual time restarts from
  the same origin: a lane that joins it gets its share from now on, neither
  credit for the time it was idle nor a debt for what it was served before.
  Two backlogged lanes of weights 4 and 1 get 4/5 and 1/5 of the calls' cost.
- **Flows, by cost, within a lane.** A flow (`Flow`: say, the calls of one
  server request) is served in arrival order, and flows share their lane by
  self-clocked fair queuing: when a call reaches the head of its flow it is
  stamped `finish = max(lane clock, flow's last finish) + cost`, and the
  smallest finish goes first; the lane clock is the finish of the call served
  last. A newcomer is stamped from the lane clock, so a small call goes
  ahead of the large pieces of other flows' backlogs: it waits for the calls
  already running and at most about one call's cost of others, never for
  another flow's backlog. A large call is not starved: each small call served
  moves the clock forward, until the large one's finish is the smallest. A
  flow's last finish is never above its lane clock once its calls are
  served, so a flow that comes back after an idle spell starts from the
  clock, as a new one does.
- **Only what is served is charged.** A call withdrawn while queued
  (cancelled, dropped, deadline passed) moves no clock, neither its lane's
  nor its flow's: the flow's next call is stamped as if it had never been
  queued.
- **Cost 0 is not free.** To order calls, a call of cost 0 counts as a
  typical call: a moving average of the positive costs pushed (over about
  the last `ZERO_COST_WINDOW` of them; 1 before any), so a stream of them
  moves the clocks like any other and cannot starve the others, and no
  single call, however cheap, makes them free. (Admission,
  `max_queued_cost`, counts costs as given.)
- **Batches are served in the same order.** `take` (a strategy that runs
  several calls together) removes matching calls one by one in the order
  `pop` would serve them, charging each lane and flow for what it got.
- **No flow: a flow of its own.** With equal costs and no flows, this is
  first in, first out.

First-in, first-out over everything is one shared flow: that is how an
`Executor(scheduling="fifo")` gets it.

Not thread-safe: the owner (a `Dispatcher`, a strategy) holds its lock.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, final

from ._call import PENDING, Call
from ._lanes import Flow, Lane

#: What a call of cost 0 counts as follows the positive costs pushed, each
#: with weight 1/16 (an average over about the last 16): a shift in the size
#: of the calls shows within a few dozen, one outlier moves it by 1/16 of
#: the difference, and no single call, however cheap, makes it near 0.
ZERO_COST_WINDOW = 16


@final
class _FlowState:
    """A flow's place in the queue while it has calls queued (the queue
    forgets it once they are served: its last finish is then at most its
    lane clock, where a new flow starts anyway)."""

    __slots__ = ("calls", "finish", "flow", "start")

    def __init__(self, flow: Flow) -> None:
        self.flow = flow
        self.calls: deque[Call[Any]] = deque()
        self.finish = 0.0  # the finish tag of its call served last
        self.start = 0.0  # its head call's start tag (its finish less its cost)


# A lane's heap entry: (finish tag, arrival number, a call that is its own
# flow or a flow whose head call carries that tag).
_Entry = tuple[float, int, "Call[Any] | _FlowState"]


@final
class _LaneState:
    __slots__ = ("clock", "epoch", "heap", "lane", "served")

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.heap: list[_Entry] = []
        self.clock = 0.0  # the finish tag of the call served last (flows' virtual time)
        self.served = 0.0  # cost served / weight since the queue was last empty (lanes' virtual time)
        self.epoch = -1  # the busy period `served` belongs to


@final
class CallQueue:
    """Queued calls, served fairly by lane, flow and cost (see the module docstring).

    Each call is scheduled in its flow's lane, or its own `call.lane` when
    it has no flow: the `Lane` objects its executor stamped on it. `push`
    and `pop` cost O(log n) in the calls queued, plus a scan of the busy
    lanes (a handful). Calls withdrawn while queued (cancelled, dropped,
    deadline passed) stay until `pop` or `take` reaches them, which skips
    them without charging their cost.
    """

    def __init__(self) -> None:
        self._lanes: dict[Lane, _LaneState] = {}
        self._flows: dict[Flow, _FlowState] = {}  # flows with calls queued
        self._busy: list[_LaneState] = []  # lanes with queued calls, in the order they became busy
        self._arrivals = itertools.count()
        self._length = 0
        # Busy periods: a new one starts each time the queue is empty.
        self._epoch = 0
        # What a call of cost 0 counts as in the clocks (see ZERO_COST_WINDOW).
        self._zero_cost = 1.0

    def __len__(self) -> int:
        """Calls in the queue (withdrawn ones included until `pop` reaches them)."""
        return self._length

    def _charge(self, cost: float) -> float:
        return cost if cost > 0 else self._zero_cost

    def _lane_state(self, call: Call[Any]) -> _LaneState:
        flow = call.flow
        lane = call.lane if flow is None else flow.lane
        state = self._lanes.get(lane)
        if state is None:
            state = self._lanes[lane] = _LaneState(lane)
        return state

    def push(self, call: Call[Any]) -> None:
        state = self._lane_state(call)
        if call.cost > 0:
            self._zero_cost += (call.cost - self._zero_cost) / ZERO_COST_WINDOW
        cost = self._charge(call.cost)
        if not state.heap:
            # Joins at the lowest virtual time among the busy lanes: its share
            # from now on, no credit for its idle time. Its own, if higher and
            # of this busy period: no skipping ahead by leaving and coming back.
            # An empty queue is a fresh start for every lane.
            joined = min(s.served for s in self._busy) if self._busy else 0.0
            if state.epoch == self._epoch:
                joined = max(joined, state.served)
            state.served, state.epoch = joined, self._epoch
            self._busy.append(state)
        flow = call.flow
        if flow is None:
            heapq.heappush(state.heap, (state.clock + cost, next(self._arrivals), call))
        else:
            queued = self._flows.get(flow)
            if queued is None:
                queued = self._flows[flow] = _FlowState(flow)
            queued.calls.append(call)
            if len(queued.calls) == 1:
                self._stamp(state, queued, max(state.clock, queued.finish))
        self._length += 1

    def _stamp(self, state: _LaneState, flow: _FlowState, start: float) -> None:
        head = flow.calls[0]
        flow.start = start
        heapq.heappush(state.heap, (start + self._charge(head.cost), next(self._arrivals), flow))

    def _serve(self, state: _LaneState, entry: _Entry) -> Call[Any] | None:
        """Serve `entry` (popped from `state.heap`): the call, its lane and flow
        charged; `None` (nothing charged) if the call was withdrawn."""
        finish, _, item = entry
        call: Call[Any]
        if isinstance(item, _FlowState):
            call = item.calls.popleft()
            withdrawn = call.state is not PENDING
            if withdrawn:
                # Never ran: the next call starts where this one would have.
                start = max(state.clock, item.start)
            else:
                item.finish = start = finish
            # Calls withdrawn behind it go now: a new head is stamped only for a call that may run.
            calls = item.calls
            while calls and calls[0].state is not PENDING:
                calls.popleft()
                self._length -= 1
            if calls:
                self._stamp(state, item, start)
            else:
                del self._flows[item.flow]
        else:
            call = item
            withdrawn = call.state is not PENDING
        self._length -= 1
        if withdrawn:
            return None
        state.clock = max(state.clock, finish)
        state.served += self._charge(call.cost) / state.lane.weight
        return call

    def _settle(self, state: _LaneState) -> None:
        """`state` may have emptied: it leaves the busy lanes; an empty queue
        starts a new busy period."""
        if not state.heap and state in self._busy:
            self._busy.remove(state)
            if not self._busy:
                self._epoch += 1

    def pop(self) -> Call[Any] | None:
        """The next call to run, or `None` if none is queued. Skips (and
        forgets) withdrawn calls."""
        while self._busy:
            state = min(self._busy, key=_served)  # ties: the lane busy longest
            call = self._serve(state, heapq.heappop(state.heap))
            self._settle(state)
            if call is not None:
                return call
        return None

    def take_back(self, call: Call[Any]) -> None:
        """Remove `call`, the call pushed last, charging nothing: its owner
        could not run it after all (it fails, and is never run)."""
        state = self._lane_state(call)
        queued = None if call.flow is None else self._flows[call.flow]
        if queued is not None and len(queued.calls) > 1 and queued.calls[-1] is call:
            queued.calls.pop()  # behind its flow's head: in no heap entry
        else:
            item: Call[Any] | _FlowState = call if queued is None else queued
            state.heap = [entry for entry in state.heap if entry[2] is not item]
            heapq.heapify(state.heap)
            if queued is not None:
                del self._flows[queued.flow]
        self._length -= 1
        self._settle(state)

    def drain(self) -> list[Call[Any]]:
        """Remove and return every queued call (withdrawn ones included)."""
        calls = list(self)
        for state in self._busy:
            state.heap = []
        self._flows.clear()
        if self._busy:
            self._busy.clear()
            self._epoch += 1
        self._length = 0
        return calls

    def __iter__(self) -> Iterator[Call[Any]]:
        """The queued calls, in no particular order."""
        for state in self._busy:
            for _, _, item in state.heap:
                if isinstance(item, _FlowState):
                    yield from item.calls
                else:
                    yield item

    def take(self, match: Callable[[Call[Any]], bool], limit: int) -> list[Call[Any]]:
        """Remove and return up to `limit` pending calls for which `match` is
        true, one by one in the order `pop` would serve them if only those
        were queued, each charged to its lane and flow as `pop` charges it: a
        call that is its own flow, or the head of its flow (a flow whose head
        does not match gives nothing: a flow is never served out of order).

        For a strategy that runs several calls together (a batch joins the
        call `pop` gave it): lanes get their weighted shares of a batch, as
        of the calls run one by one. Withdrawn calls it reaches are dropped."""
        taken: list[Call[Any]] = []
        if limit <= 0:
            return taken
        skipped: dict[int, tuple[_LaneState, list[_Entry]]] = {}
        lanes = list(self._busy)
        while lanes and len(taken) < limit:
            state = min(lanes, key=_served)  # ties: the lane busy longest
            while state.heap:
                entry = heapq.heappop(state.heap)
                item = entry[2]
                head = item.calls[0] if isinstance(item, _FlowState) else item
                if head.state is not PENDING:
                    self._serve(state, entry)  # dropped, and its flow's next call restamped
                elif match(head):
                    served = self._serve(state, entry)
                    assert served is not None
                    taken.append(served)
                    break
                else:
                    skipped.setdefault(id(state), (state, []))[1].append(entry)
            else:
                lanes.remove(state)  # nothing (more) in it matches
        for state, entries in skipped.values():
            for entry in entries:
                heapq.heappush(state.heap, entry)
        for state in list(self._busy):
            self._settle(state)
        return taken


def _served(state: _LaneState) -> float:
    return state.served
