"""A computed `Retry-After` for a 503 from a full bound.

The fewest whole seconds, between 1 and `RETRY_AFTER_CAP_S`, in which the
refused request's lane, at the rate its cost has been served of late, serves
the cost that must drain before it is admitted
(`Executor.cost_to_admit`, by admission's own rule) and the cost of the requests refused before
it that were told to come back before it and are still due
(`DrainRates.retry_after`). Under `OFFLOAD_VLLM_MAX_QUEUE` alone (places, not
cost), the same in requests. Until a lane has served anything, its rate is
taken as one typical request over the time it has been busy (at least
`RATE_MIN_SPAN_S`): the most it can have served with none answered, so the
wait told is the least that is true, and grows while nothing is answered.
Before any request was priced, 1 (the smallest the header allows).

The rate is the share of it that reaches the clients told to come back:
of those due back in the seconds past, the share not refused again then
(`_RefusedAgain`). The places that free up are also taken by requests
nobody told to wait (new clients, the next request of a client just
answered); where those take them all, the header is the cap.

A lane's rate is measured over the time it was busy (a request of it
admitted and not yet answered), not over wall time: a lane idle for a
minute and then flooded drains as fast as it did when it was last busy,
and its first refusals are told so, not a wait stretched by the idle
minute.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import final

import offload

from ._admission import AdmissionListener, Priced
from ._lanes import DEFAULT_LANE

#: The longest `Retry-After`, in seconds. A server that expects to stay full
#: for longer than this is better left for another replica than waited for,
#: and a rate measured over the last `RATE_TIME_CONSTANT_S` says little about
#: the server half a minute on.
RETRY_AFTER_CAP_S = 30

#: The shortest span a rate is measured over, in seconds: the first answers
#: of a flood come together (a batch within milliseconds), and as a rate over
#: their few milliseconds they would read as thousands a second.
RATE_MIN_SPAN_S = 1.0

#: How many of the latest priced requests of a lane the typical cost is a
#: mean of (weighted as an exponential average of this span): a flood's
#: requests are many within a second, so a change of what clients send shows
#: within one, and one odd request moves it by a thirty-second.
TYPICAL_COST_SPAN = 32

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
class _DueBack:
    """The refused requests told to come back that are still due, by the whole
    second they are due back in: a ring of `RETRY_AFTER_CAP_S + 1` seconds
    (the current one and the furthest a `Retry-After` reaches), each with the
    cost and the count of the requests due back in it. A second's place in the
    ring is reused once that second has passed, so memory stays bounded and a
    refusal costs at most one pass over the ring."""

    __slots__ = ("_cost", "_count", "_latest", "_second")

    def __init__(self) -> None:
        size = RETRY_AFTER_CAP_S + 1
        self._second: list[int | None] = [None] * size  # the whole second each place holds
        self._cost = [0.0] * size
        self._count = [0] * size
        self._latest = [0.0] * size  # the last time due in it

    def add(self, due: float, cost: float) -> None:
        """A request of `cost`, refused, is due back at `due`."""
        second = math.floor(due)
        i = second % len(self._second)
        if self._second[i] != second:  # a second passed: its place is free
            self._second[i], self._cost[i], self._count[i], self._latest[i] = second, 0.0, 0, due
        self._cost[i] += cost
        self._count[i] += 1
        self._latest[i] = max(self._latest[i], due)

    def count_in(self, second: int) -> int:
        """How many requests are due back in the whole `second` (0 once its
        place in the ring holds another second)."""
        return int(self._in(second, by_cost=False))

    def _in(self, second: int, by_cost: bool) -> float:
        i = second % len(self._second)
        if self._second[i] != second:
            return 0.0
        return self._cost[i] if by_cost else float(self._count[i])

    def first_fit(self, now: float, need: float, per_second: float, by_cost: bool) -> int:
        """The fewest whole seconds `r` (1 to `RETRY_AFTER_CAP_S`) in which,
        at `per_second`, the lane serves `need` and the cost (`by_cost`) or
        the count of the requests due back before `now + r`;
        `RETRY_AFTER_CAP_S` if none. At one second's resolution: the current
        second's requests count until the last of them is due, and those due
        in the same whole second as `now + r` count as before it."""
        current = math.floor(now)
        i = current % len(self._second)
        waiting = self._in(current, by_cost) if self._latest[i] > now else 0.0
        for seconds in range(1, RETRY_AFTER_CAP_S + 1):
            waiting += self._in(current + seconds, by_cost)
            if (need + waiting) / per_second <= seconds:
                return seconds
        return RETRY_AFTER_CAP_S


#: Weight kept by the share of returning requests refused again, per whole
#: second closed with any due: an average over about `RATE_TIME_CONSTANT_S`
#: such seconds.
_AGAIN_KEPT = math.exp(-1.0 / RATE_TIME_CONSTANT_S)


@final
class _RefusedAgain:
    """Of the refused requests due back in each past whole second (`_DueBack`),
    how many of them at most were refused again in it: each refusal counted
    in its whole second, and the second closed (its due ones compared with
    its refusals, of which at most that many were theirs) once a refusal
    comes in a later one. An exponentially weighted share over the seconds
    in which any were due. A second with no refusal let every one due in.
    After longer than `RETRY_AFTER_CAP_S` without a refusal, every wait told
    is over and the overload it measured has ended: the share starts anew."""

    __slots__ = ("_refused", "_second", "again", "due")

    def __init__(self) -> None:
        self._second: int | None = None  # the whole second refusals are counted in
        self._refused = 0
        self.due = 0.0  # due back in the seconds closed, weighted
        self.again = 0.0  # of them, refused again (at most), weighted

    def refused(self, now: float, due_back: _DueBack) -> None:
        """Count a refusal at `now`, closing the seconds before it first (before
        anything is added to `due_back` for this one: a second's place in its
        ring is reused for the second `RETRY_AFTER_CAP_S + 1` after it)."""
        second = math.floor(now)
        if self._second is not None and second > self._second:
            self._close(due_back.count_in(self._second), self._refused)
            for past in range(max(self._second + 1, second - RETRY_AFTER_CAP_S), second):
                self._close(due_back.count_in(past), 0)
            if second - self._second > RETRY_AFTER_CAP_S:
                self.due = self.again = 0.0
            self._refused = 0
        if self._second is None or second > self._second:
            self._second = second
        self._refused += 1

    def _close(self, due: int, refused: int) -> None:
        if due <= 0:
            return
        self.due = self.due * _AGAIN_KEPT + due
        self.again = self.again * _AGAIN_KEPT + min(refused, due)

    def share(self) -> float:
        """The weighted share of the requests due back that were refused again; 0 before any was due."""
        return self.again / self.due if self.due > 0 else 0.0


@final
class _LaneRates:
    """One lane's served rates, on the clock of its busy time, and its refused
    requests still due back."""

    __slots__ = (
        "busy_before", "busy_since", "due_back", "in_flight", "priced", "priced_cost", "priced_engine_requests",
        "refused_again", "served_cost", "served_requests",
    )

    def __init__(self) -> None:
        self.served_cost = _Rate()
        self.served_requests = _Rate()
        self.due_back = _DueBack()
        self.refused_again = _RefusedAgain()
        self.priced = 0  # requests priced (up to TYPICAL_COST_SPAN: the weight of the latest)
        self.priced_cost = 0.0  # their mean cost, weighted to the latest
        self.priced_engine_requests = 0.0  # their mean engine requests, weighted alike
        self.in_flight = 0  # admitted, not yet answered
        self.busy_since: float | None = None  # when `in_flight` last left 0
        self.busy_before = 0.0  # busy seconds before `busy_since`

    def busy_clock(self, now: float) -> float:
        """Seconds this lane has been busy, up to `now`: the clock its rates run on."""
        return self.busy_before + (0.0 if self.busy_since is None else now - self.busy_since)


@final
class DrainRates(AdmissionListener):
    """Per lane, the rates at which requests and their cost were served
    (their admission ended), and the refused requests told to come back that
    are still due: a listener on admission (`admitted`, `answered`). Used on
    the event loop's thread only."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lanes: dict[str, _LaneRates] = {}

    def _lane(self, lane: str) -> _LaneRates:
        rates = self._lanes.get(lane)
        if rates is None:
            rates = self._lanes[lane] = _LaneRates()
        return rates

    def priced(self, request: Priced) -> None:
        """`request` was priced: its cost enters its lane's typical cost."""
        rates = self._lane(request.lane)
        rates.priced = min(rates.priced + 1, TYPICAL_COST_SPAN)
        rates.priced_cost += (request.cost - rates.priced_cost) / rates.priced
        rates.priced_engine_requests += (request.engine_requests - rates.priced_engine_requests) / rates.priced

    def admitted(self, request: Priced) -> None:
        """`request` was admitted: its lane is busy until every request
        admitted in it is `answered`."""
        rates = self._lane(request.lane)
        if rates.in_flight == 0:
            rates.busy_since = self._clock()
        rates.in_flight += 1

    def answered(self, request: Priced) -> None:
        """`request`, `admitted`, was answered: its cost was served."""
        rates = self._lane(request.lane)
        busy = rates.busy_clock(self._clock())
        rates.served_cost.add(request.cost, busy)
        rates.served_requests.add(1.0, busy)
        rates.in_flight = max(0, rates.in_flight - 1)
        if rates.in_flight == 0:
            rates.busy_before, rates.busy_since = busy, None

    def typical_cost(self, lane: str = DEFAULT_LANE) -> float:
        """The mean cost of the latest requests of `lane` priced for admission
        (about `TYPICAL_COST_SPAN` of them, the latest weighing most), admitted
        or refused: known from the first request's decision at the serving seam,
        which prices it first (`priced`; the door's floor prices are left out); 1 before any request (no request to agree with). The
        mean of the requests answered instead stayed 1 until the first answer,
        seconds into a flood, and readiness said 200 while admission refused."""
        rates = self._lane(lane)
        return rates.priced_cost if rates.priced else 1.0

    def typical_engine_requests(self, lane: str = DEFAULT_LANE) -> float:
        """The mean engine requests of the same requests as `typical_cost`; 1 before any."""
        rates = self._lane(lane)
        return rates.priced_engine_requests if rates.priced else 1.0

    def retry_after(self, executor: offload.Executor, lane: str, cost: float) -> int:
        """`Retry-After` for a request of `cost` in `lane` just refused: the
        fewest whole seconds `r` (1 to `RETRY_AFTER_CAP_S`) in which its lane,
        at the rate it has been served, serves what must drain before it is
        admitted (`Executor.cost_to_admit`; under `OFFLOAD_VLLM_MAX_QUEUE` alone, one
        request) and the requests refused before it that are due back before
        it (`now + r`); those due back later come after it. The request is
        then counted as due back at `now + r`, until then. Without that
        count, every client refused during a flood is told the same short
        wait, and they come back together to be refused again.

        The rate is the lane's served rate times the share of the requests
        due back in the seconds past that were not refused again then
        (`_RefusedAgain`); the cap where none was let in.

        The count is exact for clients that honour the header: a herd of N
        refused within a millisecond counts N, one each. It assumes they
        do. A client that comes back early is counted again while its first
        refusal is still due, so clients that ignore the header inflate it
        for every client of the lane, up to the cap."""
        now = self._clock()
        rates = self._lane(lane)
        excess = executor.cost_to_admit(cost=cost, lane=lane)
        # Refused with no cost to drain: a place (OFFLOAD_VLLM_MAX_QUEUE) must free up.
        by_cost = bool(excess)
        served = rates.served_cost if by_cost else rates.served_requests
        per_second = served.per_second(rates.busy_clock(now))
        if per_second <= 0 and rates.priced:
            # None answered yet: under one typical request served over its busy time.
            unit = rates.priced_cost if by_cost else 1.0
            per_second = unit / max(rates.busy_clock(now), RATE_MIN_SPAN_S)
        rates.refused_again.refused(now, rates.due_back)
        # The places that free up go to every request then arriving, not only
        # to those told to come back: they get the share that was let in.
        let_in = per_second * (1.0 - rates.refused_again.share())
        if per_second <= 0:
            told = 1  # nothing priced yet: the least the header allows
        elif let_in <= 0:
            told = RETRY_AFTER_CAP_S  # every one told to come back was refused again
        else:
            told = rates.due_back.first_fit(now, excess if excess else 1.0, let_in, by_cost)
        rates.due_back.add(now + told, cost)
        return told
