"""The computed `Retry-After` (`offload_vllm._retry_after`) and the admission
state it reads (`offload_vllm._admission`), on a real executor."""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Iterator

import pytest
from offload_vllm._admission import Priced
from offload_vllm._retry_after import (
    RATE_TIME_CONSTANT_S,
    RETRY_AFTER_CAP_S,
    DrainRates,
    _Rate,
)

import offload


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def serve(rates: DrainRates, clock: Clock, per_second: int, seconds: float, cost: float = 1.0) -> None:
    """`per_second` requests of `cost` answered a second, evenly, for `seconds`
    from `clock.now`, which is left at the last answer: a busy lane, each
    answer followed by the next request's admission, so one is left in flight."""
    start = clock.now
    rates.admitted(Priced(1.0))
    for k in range(int(per_second * seconds)):
        clock.now = start + (k + 1) / per_second
        rates.answered(Priced(cost))
        rates.admitted(Priced(1.0))


def test_a_steady_rate_reads_as_itself_and_decays_once_nothing_is_served() -> None:
    clock = Clock()
    rate = _Rate()
    for _ in range(int(RATE_TIME_CONSTANT_S * 10)):  # 1,000 a second for a time constant
        clock.now += 0.1
        rate.add(100.0, clock.now)
    assert rate.per_second(clock.now) == pytest.approx(1000.0, rel=0.05)
    young = _Rate()
    for _ in range(20):  # 10 a second, for 2 s
        clock.now += 0.1
        young.add(1.0, clock.now)
    assert young.per_second(clock.now) == pytest.approx(10.0, rel=0.1)
    burst = _Rate()
    for _ in range(100):  # a hundred within 10 ms: over a second, not over 10 ms
        clock.now += 0.0001
        burst.add(1.0, clock.now)
    assert burst.per_second(clock.now) == pytest.approx(100.0, rel=0.01)
    clock.now += RATE_TIME_CONSTANT_S
    assert rate.per_second(clock.now) < 1000.0 / 2


@pytest.fixture
def held_executor() -> Iterator[tuple[offload.Executor, threading.Event]]:
    """One worker held busy, with a cost bound of 1,000 over lanes default=1, bulk=3."""
    executor = offload.get_executor("thread", max_workers=1, max_queued_cost=1000, lanes={"bulk": 3.0})
    release, running = threading.Event(), threading.Event()

    def hold() -> None:
        running.set()
        release.wait()

    executor.submit(hold)
    assert running.wait(30)  # started: its cost is no longer queued
    try:
        yield executor, release
    finally:
        release.set()
        executor.shutdown(wait=True)


def test_cost_to_admit_follows_the_admission_rule(held_executor: tuple[offload.Executor, threading.Event]) -> None:
    executor, _ = held_executor
    assert executor.cost_to_admit(cost=100.0, lane="default") == 0.0
    assert not executor.would_refuse()
    # `default`'s share is 250: 900 held there leaves the total 100 and the lane nothing.
    with executor.admission("test", cost=900.0):
        pass
    with executor.admission("test", cost=900.0) as _held:
        # Held cost: 250 (its share). A unit of work is checked at most at its
        # lane's share too, so 800 is checked as 250: within the total bound.
        assert executor.cost_to_admit(cost=750.0, lane="default") == 0.0
        assert executor.cost_to_admit(cost=800.0, lane="default") == 0.0
        assert not executor.would_refuse(cost=800.0)
        with executor.admission("test", cost=600.0, lane="bulk"):  # holds 600 of bulk's 750
            # Total 850: 200 more exceeds it by 50, the lane's share by 200: 50 must drain.
            assert executor.cost_to_admit(cost=200.0, lane="default") == pytest.approx(50.0)
            assert executor.would_refuse(cost=200.0)
            assert not executor.would_refuse(cost=150.0)
            assert executor.cost_to_admit(cost=150.0, lane="default") == 0.0
    unbounded = offload.get_executor("thread", max_workers=1)
    try:
        assert unbounded.cost_to_admit(cost=1e9, lane="default") is None
    finally:
        unbounded.shutdown()


def test_retry_after_is_the_time_to_drain_and_serve_the_clients_due_back_first(
    held_executor: tuple[offload.Executor, threading.Event],
) -> None:
    executor, _ = held_executor
    clock = Clock()
    rates = DrainRates(clock)
    assert rates.retry_after(executor, "default", 200.0) == 1  # nothing served yet: the least
    clock.now += 20 * RATE_TIME_CONSTANT_S  # that refusal is long past
    serve(rates, clock, 10, 10 * RATE_TIME_CONSTANT_S)  # 10 cost a second in `default`
    with executor.admission("test", cost=250.0), executor.admission("test", cost=600.0, lane="bulk"):
        # 850 held; a request of 200 needs 50 drained: 5 s at 10 a second.
        assert rates.retry_after(executor, "default", 200.0) == 5
        # The next is told to wait behind that one's 200 too: 25 s. The one
        # after it would need 45 s: the cap.
        clock.now += 0.0001
        assert rates.retry_after(executor, "default", 200.0) == 25
        clock.now += 0.0001
        assert rates.retry_after(executor, "default", 200.0) == RETRY_AFTER_CAP_S
        # Costlier than the lane's share: admitted once its lane is empty.
        clock.now += 20 * RATE_TIME_CONSTANT_S  # nothing served for long: the rate is near 0
        assert rates.retry_after(executor, "default", 200.0) == RETRY_AFTER_CAP_S


def test_before_any_answer_the_wait_told_grows_with_the_time_none_was_answered(
    held_executor: tuple[offload.Executor, threading.Event],
) -> None:
    """A flood's first refusals come before anything was answered: the lane's
    rate is taken as one typical request over its busy time (the most it can
    have served), so a request that needs 50 of cost drained, with requests
    of 100 admitted, is told 1 s at once, 5 s ten seconds on, the cap after a
    hundred: never 1 s throughout, as when a lane with no answer counted as unmeasured."""
    executor, _ = held_executor
    clock = Clock()
    rates = DrainRates(clock)
    for _ in range(3):
        request = Priced(100.0, "default", 1)
        rates.priced(request)
        rates.admitted(request)
    with executor.admission("test", cost=250.0), executor.admission("test", cost=600.0, lane="bulk"):
        assert executor.cost_to_admit(cost=200.0, lane="default") == pytest.approx(50.0)
        clock.now += 0.5
        assert rates.retry_after(executor, "default", 200.0) == 1
        clock.now += 9.5
        assert rates.retry_after(executor, "default", 200.0) == 5
        clock.now += 90.0
        assert rates.retry_after(executor, "default", 200.0) == RETRY_AFTER_CAP_S


def test_a_lane_idle_for_long_then_full_is_told_the_rate_it_was_served_at_while_busy(
    held_executor: tuple[offload.Executor, threading.Event],
) -> None:
    """The rate runs on the lane's busy time: five idle minutes do not make a
    flood that follows them look slow to drain (on wall time it read as
    e^-30 of itself, and the first refusals were told the cap)."""
    executor, _ = held_executor
    clock = Clock()
    rates = DrainRates(clock)
    serve(rates, clock, 10, 10 * RATE_TIME_CONSTANT_S)  # 10 cost a second in `default`
    clock.now += 0.1
    rates.answered(Priced(1.0))  # the last one in flight answered: the lane is idle
    clock.now += 30 * RATE_TIME_CONSTANT_S
    with executor.admission("test", cost=250.0), executor.admission("test", cost=600.0, lane="bulk"):
        assert rates.retry_after(executor, "default", 200.0) == 5  # 50 to drain at 10 a second
        # Busy again, with nothing answered for long: then it reads as slow.
        rates.admitted(Priced(1.0))
        clock.now += 20 * RATE_TIME_CONSTANT_S
        assert rates.retry_after(executor, "default", 200.0) == RETRY_AFTER_CAP_S


def test_a_herd_refused_together_is_told_to_come_back_spread_by_the_cost_due_back(
    held_executor: tuple[offload.Executor, threading.Event],
) -> None:
    """20 requests of cost 200, each needing 50 drained, refused within a
    millisecond, at 1,000 cost a second: each second takes 5 of them."""
    executor, _ = held_executor
    clock = Clock()
    rates = DrainRates(clock)
    serve(rates, clock, 100, 10 * RATE_TIME_CONSTANT_S, cost=10.0)
    with executor.admission("test", cost=250.0), executor.admission("test", cost=600.0, lane="bulk"):
        told = []
        for _ in range(20):
            clock.now += 0.00005
            told.append(rates.retry_after(executor, "default", 200.0))
    assert told == [1] * 5 + [2] * 5 + [3] * 5 + [4] * 5


@pytest.fixture
def full_places() -> Iterator[offload.Executor]:
    """A bound of places alone (`max_queue=0`), full."""
    executor = offload.get_executor("thread", max_workers=1, max_queue=0)
    try:
        with executor.admission("test", cost=1.0):
            assert executor.overloaded
            yield executor
    finally:
        executor.shutdown()


def test_under_a_place_bound_alone_the_wait_counts_requests(full_places: offload.Executor) -> None:
    clock = Clock()
    rates = DrainRates(clock)
    serve(rates, clock, 2, 10.0, cost=1e6)
    assert rates.retry_after(full_places, "default", 1.0) == 1  # one place, at 2 a second
    clock.now += 0.001
    assert rates.retry_after(full_places, "default", 1.0) == 1  # and the one due back before it
    clock.now += 0.001
    assert rates.retry_after(full_places, "default", 1.0) == 2


def herd(rates: DrainRates, clock: Clock, executor: offload.Executor, count: int) -> list[int]:
    """`Retry-After` told to `count` requests refused within a millisecond."""
    told = []
    for _ in range(count):
        clock.now += 1e-3 / count
        told.append(rates.retry_after(executor, "default", 1.0))
    return told


def test_a_herd_is_told_to_come_back_as_fast_as_the_lane_serves_not_all_at_the_cap(
    full_places: offload.Executor,
) -> None:
    """500 refused within a millisecond, at 100 requests a second: a second
    each for 100 of them, 5 s for the last. (Estimated as the rate of
    refusals times the last value told, the herd's few milliseconds read as
    hundreds a second, and the value climbed to the cap within the herd.)"""
    clock = Clock()
    clock.now += 0.3  # the herd within one whole second of the clock
    rates = DrainRates(clock)
    serve(rates, clock, 100, 10 * RATE_TIME_CONSTANT_S)
    told = herd(rates, clock, full_places, 500)
    assert told == sorted(told)
    counted = collections.Counter(told)
    assert set(counted) == {1, 2, 3, 4, 5}, counted
    assert all(abs(n - 100) <= 1 for n in counted.values()), counted


def test_the_requests_due_back_leave_the_count_once_their_time_is_past(full_places: offload.Executor) -> None:
    clock = Clock()
    clock.now += 0.3
    rates = DrainRates(clock)
    serve(rates, clock, 100, 10 * RATE_TIME_CONSTANT_S)
    assert max(herd(rates, clock, full_places, 500)) == 5
    # 2.5 s on (served as before), the 200 told 1 and 2 s are past: the 300
    # still due and this one take a little over 3 s.
    serve(rates, clock, 100, 2.5)
    clock.now += 0.01
    assert rates.retry_after(full_places, "default", 1.0) == 4
    # Once every one told is past, only this request's own place is waited for.
    serve(rates, clock, 100, 5.0)
    clock.now += 0.01
    assert rates.retry_after(full_places, "default", 1.0) == 1


def test_a_herd_past_what_the_cap_serves_is_told_the_cap(full_places: offload.Executor) -> None:
    clock = Clock()
    clock.now += 0.3
    rates = DrainRates(clock)
    serve(rates, clock, 100, 10 * RATE_TIME_CONSTANT_S)
    told = collections.Counter(herd(rates, clock, full_places, 5_000))
    assert set(told) == set(range(1, RETRY_AFTER_CAP_S + 1)), told
    assert all(abs(told[seconds] - 100) <= 1 for seconds in range(1, RETRY_AFTER_CAP_S)), told
    assert told[RETRY_AFTER_CAP_S] >= 5_000 - 101 * (RETRY_AFTER_CAP_S - 1), told


def test_a_client_back_before_its_time_is_counted_again(full_places: offload.Executor) -> None:
    """The count's stated limit: the same 100 clients, refused every half
    second whatever they were told, are counted again each time while their
    earlier refusals are still due, so the wait told grows over the
    rounds, though 100 clients need 1 s at 100 a second."""
    clock = Clock()
    clock.now += 0.3
    rates = DrainRates(clock)
    serve(rates, clock, 100, 10 * RATE_TIME_CONSTANT_S)
    longest = []
    for _ in range(6):
        longest.append(max(herd(rates, clock, full_places, 100)))
        serve(rates, clock, 100, 0.5)  # answered as before: no place is ever free for them
    assert longest[0] == 1
    assert longest[-1] >= 4, longest


def test_clients_refused_again_when_they_come_back_are_told_to_wait_longer(full_places: offload.Executor) -> None:
    """100 refused together are told 1 s at 100 a second. When they come back
    and all are refused again (the places went to requests nobody told to
    wait), the lane lets none of its returning clients in: the next is told
    the cap. Where half are refused again, it drains for them at half the rate."""
    clock = Clock()
    clock.now += 0.3
    rates = DrainRates(clock)
    serve(rates, clock, 100, 10 * RATE_TIME_CONSTANT_S)
    assert set(herd(rates, clock, full_places, 100)) == {1}
    clock.now = math.floor(clock.now) + 1.5  # their second: every one refused again
    assert max(herd(rates, clock, full_places, 100)) <= 2
    clock.now = math.floor(clock.now) + 1.5
    assert rates.retry_after(full_places, "default", 1.0) == RETRY_AFTER_CAP_S

    half = DrainRates(clock)
    serve(half, clock, 100, 10 * RATE_TIME_CONSTANT_S)
    clock.now = math.floor(clock.now) + 0.3
    assert set(herd(half, clock, full_places, 100)) == {1}
    clock.now = math.floor(clock.now) + 1.5
    herd(half, clock, full_places, 50)  # about half of those due refused again
    clock.now = math.floor(clock.now) + 1.1
    # The ~50 due back later in this second, and this one: at the share let
    # in of 100 a second (about 50), 2 s; at 100 a second it would be 1 s.
    assert half.retry_after(full_places, "default", 1.0) == 2
    assert 0.4 < half._lane("default").refused_again.share() < 0.6


def test_a_new_overload_after_a_quiet_spell_starts_without_the_last_ones_share(full_places: offload.Executor) -> None:
    """Every returning client refused again: the cap. Then no refusal for
    longer than any wait told (the overload over, the lane serving): the next
    herd is spread at the rate served, not told the cap for what happened
    before."""
    clock = Clock()
    clock.now += 0.3
    rates = DrainRates(clock)
    serve(rates, clock, 100, 10 * RATE_TIME_CONSTANT_S)
    herd(rates, clock, full_places, 100)
    clock.now = math.floor(clock.now) + 1.5
    herd(rates, clock, full_places, 100)  # all due now, all refused again
    clock.now = math.floor(clock.now) + 1.5
    assert rates.retry_after(full_places, "default", 1.0) == RETRY_AFTER_CAP_S
    serve(rates, clock, 100, RETRY_AFTER_CAP_S + 5.0)  # served, nobody refused
    clock.now = math.floor(clock.now) + 1.3  # the herd within one whole second
    assert set(herd(rates, clock, full_places, 50)) == {1}  # 50 at 100 a second


def test_clients_let_in_when_they_come_back_leave_the_rate_as_served(full_places: offload.Executor) -> None:
    clock = Clock()
    clock.now += 0.3
    rates = DrainRates(clock)
    serve(rates, clock, 100, 10 * RATE_TIME_CONSTANT_S)
    assert set(herd(rates, clock, full_places, 100)) == {1}
    serve(rates, clock, 100, 2.0)  # their second passes without a refusal: all let in
    assert set(herd(rates, clock, full_places, 100)) == {1}
