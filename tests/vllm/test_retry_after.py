"""The computed `Retry-After` (`offload_vllm._retry_after`) and the admission
state it reads (`offload_vllm._admission_view`), on a real executor."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from offload_vllm._admission_view import cost_to_drain
from offload_vllm._retry_after import (
    RATE_TIME_CONSTANT_S,
    RETRY_AFTER_CAP_S,
    DrainRates,
    _Rate,
    clamp_retry_after,
)

import offload


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_clamped_to_whole_seconds_from_one_to_the_cap() -> None:
    assert [clamp_retry_after(s) for s in (None, float("nan"), 0.0, 0.2, 1.0, 1.01, 7.5)] == [1, 1, 1, 1, 1, 2, 8]
    assert clamp_retry_after(1e9) == RETRY_AFTER_CAP_S


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


def test_cost_to_drain_follows_the_admission_rule(held_executor: tuple[offload.Executor, threading.Event]) -> None:
    executor, _ = held_executor
    assert cost_to_drain(executor, None, 100.0) == 0.0
    assert not executor.would_refuse()
    # `default`'s share is 250: 900 held there leaves the total 100 and the lane nothing.
    with executor.admission("test", cost=900.0):
        pass
    with executor.admission("test", cost=900.0) as _held:
        # Held cost: 250 (its share). A unit of work is checked at most at its
        # lane's share too, so 800 is checked as 250: within the total bound.
        assert cost_to_drain(executor, None, 750.0) == 0.0
        assert cost_to_drain(executor, None, 800.0) == 0.0
        assert not executor.would_refuse(cost=800.0)
        with executor.admission("test", cost=600.0, lane="bulk"):  # holds 600 of bulk's 750
            # Total 850: 200 more exceeds it by 50, the lane's share by 200: 50 must drain.
            assert cost_to_drain(executor, None, 200.0) == pytest.approx(50.0)
            assert executor.would_refuse(cost=200.0)
            assert not executor.would_refuse(cost=150.0)
            assert cost_to_drain(executor, None, 150.0) == 0.0
    unbounded = offload.get_executor("thread", max_workers=1)
    try:
        assert cost_to_drain(unbounded, None, 1e9) is None
    finally:
        unbounded.shutdown()


def test_retry_after_is_the_time_to_drain_and_serve_the_clients_waiting_first(
    held_executor: tuple[offload.Executor, threading.Event],
) -> None:
    executor, _ = held_executor
    clock = Clock()
    rates = DrainRates(clock)
    assert rates.retry_after(executor, None, 200.0) == 1  # nothing served yet: the least
    clock.now += 20 * RATE_TIME_CONSTANT_S  # that refusal is long forgotten
    for _ in range(100):  # 10 cost a second in `default`, for 10 s
        clock.now += 0.1
        rates.served(None, 1.0)
    with executor.admission("test", cost=250.0), executor.admission("test", cost=600.0, lane="bulk"):
        # 850 held; a request of 200 needs 50 drained: 5 s at 10 a second.
        assert rates.retry_after(executor, None, 200.0) == 5
        # Refusals keep coming, 10 a second of cost 200: each is told to wait
        # behind the ones told before it, until the wait is the time to serve
        # the backlog that refusal rate and wait make (Little's law).
        told = []
        for _ in range(50):
            clock.now += 0.1
            told.append(rates.retry_after(executor, None, 200.0))
        assert told == sorted(told)
        assert told[-1] > 5 * 5
        # Costlier than the lane's share: admitted once its lane is empty.
        clock.now += 20 * RATE_TIME_CONSTANT_S  # nothing served for long: the rate is near 0
        assert rates.retry_after(executor, None, 200.0) == RETRY_AFTER_CAP_S


def test_under_a_place_bound_alone_the_wait_counts_requests() -> None:
    executor = offload.get_executor("thread", max_workers=1, max_queue=0)
    clock = Clock()
    rates = DrainRates(clock)
    try:
        for _ in range(20):  # 2 requests a second, for 10 s
            clock.now += 0.5
            rates.served(None, 1e6)
        with executor.admission("test", cost=1.0):
            assert executor.overloaded
            assert rates.retry_after(executor, None, 1.0) == 1  # one place, at 2 a second
    finally:
        executor.shutdown()
