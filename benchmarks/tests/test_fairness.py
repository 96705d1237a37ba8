"""The fairness benchmark's accounting (`benchmarks/suites/fairness.py`), and that it
tells fair scheduling from first come, first served on a real executor.

Its smoke run is in `tests/test_benchmark_smoke.py`."""

from __future__ import annotations

import random

import pytest

from benchmarks.suites import fairness


def test_served_cost_is_counted_in_start_order_until_one_client_runs_out() -> None:
    weights = {"a": 1.0, "b": 1.0}
    # a: 10, 10; b: 40 then 5. a's second (last) call ends the window: b's 5 is not counted.
    events = [(0.0, "b", 40.0), (1.0, "a", 10.0), (2.0, "a", 10.0), (3.0, "b", 5.0)]
    result = fairness.measure(events, weights, calls=2)
    assert result["pieces"] == 3
    assert result["served"] == {"a": 20.0, "b": 40.0}
    # a - b: 0, -40, -30, -20: the largest gap over any interval is 40, one piece of b's largest (40).
    assert result["largest_gap"] == 40.0
    assert result["largest_gap_pieces"] == pytest.approx(40.0 / fairness.MAX_COST["b"])
    assert result["share_ratio"] == pytest.approx(0.5)


def test_weights_divide_the_served_cost() -> None:
    events = [(0.0, "a", 8.0), (1.0, "b", 2.0), (2.0, "a", 8.0)]
    result = fairness.measure(events, {"a": 4.0, "b": 1.0}, calls=2)
    assert result["share_ratio"] == pytest.approx((16 / 4) / 2)


@pytest.mark.parametrize("scenario", fairness.SCENARIOS[:3], ids=lambda s: s.name)
def test_it_tells_fair_scheduling_from_fifo(scenario: fairness.Scenario) -> None:
    found = {}
    for scheduling in ("fair", "fifo"):
        with fairness._executor("thread", 1, scenario.lanes, scheduling) as executor:
            found[scheduling] = fairness.run_once(
                executor, scenario, random.Random(3), calls=60, unit_s=2e-5, workers=1, gate_s=0.2
            )
    # Fair: the gap stays about a piece, whatever the backlog; FIFO's grows with it.
    assert found["fair"]["largest_gap_pieces"] < 3
    assert found["fifo"]["largest_gap_pieces"] > 10
    assert found["fair"]["share_ratio"] == pytest.approx(1, abs=0.5)
    assert found["fifo"]["share_ratio"] < 0.5
