"""pytest-benchmark view of what the `offload_*` metrics add to a call: one
`Call` admitted, started and finished through an executor's admission (`Limiter`), metrics
on and off.

`make test` runs these once with `--benchmark-disable`; time them with
`pytest benchmarks/tests/test_metrics_pytest_benchmark.py --benchmark-enable`
(the difference of the two rows' medians, over CALLS, is what a call pays).
What the committed run found: decision record 0014.
"""

from __future__ import annotations

from typing import Any

import pytest

from offload._admission import Limiter, Limits
from offload._call import Call
from offload._lanes import Lanes
from offload._metrics import call_metrics, function_label

CALLS = 1000  # per timed round


def _identity(x: int) -> int:
    return x


def _run_seconds_count() -> float:
    prometheus = pytest.importorskip("prometheus_client")
    labels = {"strategy": "thread", "function": function_label(_identity)}
    return prometheus.REGISTRY.get_sample_value("offload_run_seconds_count", labels) or 0.0


@pytest.mark.parametrize("metrics", [True, False], ids=["metrics-on", "metrics-off"])
def test_a_tracked_call(benchmark: Any, metrics: bool) -> None:
    lanes = Lanes()
    listener = call_metrics("thread", lanes) if metrics else None
    tracker = Limiter("thread", lanes, Limits(2, None, None), listener)
    rounds = 0

    def calls() -> int:
        nonlocal rounds
        rounds += 1
        finished = 0
        for i in range(CALLS):
            call: Call[int] = Call(_identity, (i,), {})
            call.lane = lanes.default
            tracker.admit(call)
            call.claim()
            call.set_result(i)
            finished += call.done
        return finished

    before = _run_seconds_count()
    assert benchmark(calls) == CALLS
    # Every call observed once in offload_run_seconds with metrics on, none with them off.
    assert _run_seconds_count() - before == (CALLS * rounds if metrics else 0)
