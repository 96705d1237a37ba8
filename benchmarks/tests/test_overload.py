"""The overload benchmark's parts that need no vLLM: readiness beside admission
(`--readiness`) from made-up levels, as the clients saw it and as the server
counted it at each decision."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from benchmarks.suites import overload


def test_agreement_gives_the_clients_and_the_servers_shares_apart() -> None:
    levels = [
        {
            "side_by_side": {"200 200": 90, "200 503": 10, "503 503": 1, "503 200": 3},
            "at_decision": {"200 200": 99, "200 503": 1, "503 503": 4, "503 200": 0},
            "send_bins": {"0": [90, 0], "1": [10, 4]},
        },
        {
            "side_by_side": {"200 200": 50, "503 200": 5},
            "at_decision": {"200 200": 48, "200 503": 2, "503 503": 5},
            "send_bins": {"0": [50, 5]},
        },
    ]
    agreed = overload.agreement(levels)
    assert agreed["refused_not_ready"]["per_level"] == [pytest.approx(0.25), 0.0]
    assert agreed["refused_not_ready"]["pooled"] == pytest.approx(1 / 9)
    assert agreed["admitted_ready"]["pooled"] == pytest.approx(140 / 150)
    server = agreed["server"]
    assert server["refused_not_ready"]["per_level"] == [1.0, 1.0]
    assert server["admitted_ready"]["per_level"] == [pytest.approx(0.99), pytest.approx(0.96)]
    assert server["admitted_ready"]["pooled"] == pytest.approx(147 / 150)
    assert server["counts"] == {"200 200": 147, "200 503": 3, "503 503": 9, "503 200": 0}
    line = overload.readiness_line(agreed)
    assert "of 9 refused requests, `/ready` answered 503 for 100.0% (median of 2 levels" in line
    assert "of 150 admitted ones, 200 for 97.5% (median of 2 levels; range 96.0-99.0%), pooled 98.0%" in line
    assert line.index("at each admission decision") < line.index("as the clients saw it")


def test_without_the_servers_count_the_line_gives_the_clients_alone() -> None:
    agreed = overload.agreement([{"side_by_side": {"200 200": 9, "503 503": 1}}])
    assert agreed["server"]["counts"] == {}
    line = overload.readiness_line(agreed)
    assert "at each admission decision" not in line
    assert "of 1 refused requests, `/ready` answered 503 for 100.0%" in line


def _levels(refused: list[int], accepted_per_s: list[float]) -> list[dict[str, Any]]:
    return [
        {"statuses": {"200": 100, "503": r}, "accepted_per_s": a, "retry_after_told": {"10": 1, "2": r}}
        for r, a in zip(refused, accepted_per_s, strict=True)
    ]


def test_retry_after_comparison_is_judged_per_pair_on_the_medians_interval() -> None:
    rows = {
        "computed": _levels([10, 20, 30, 40, 90], [100.0, 96.0, 99.0, 120.0, 90.0]),
        "constant": _levels([100, 100, 100, 100, 100], [100.0] * 5),
    }
    ratios = overload.retry_after_ratios(rows)
    assert ratios["refused_ratio"] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.9])
    assert ratios["accepted_ratio"] == pytest.approx([1.0, 0.96, 0.99, 1.2, 0.9])
    # With 5 pairs the interval is [min, max]: the median meets both goals, the interval neither.
    assert overload.goal_verdict(ratios["refused_ratio"], 0.5, at_least=False).startswith("met by the median only")
    assert overload.goal_verdict(ratios["accepted_ratio"], 0.95, at_least=True).startswith("met by the median only")
    assert overload.goal_verdict([0.1, 0.2, 0.3], 0.5, at_least=False) == "met by the whole interval"
    assert overload.goal_verdict([0.6, 0.7, 0.2], 0.5, at_least=False).startswith("missed")
    machine = {"cpus": 2, "platform": "Linux", "date": "today", "commit": "abc", "versions": {}}
    result = {
        "command": "python -m benchmarks overload --compare-retry-after", "machine": machine, "dirty": False,
        "loadavg_before": "1", "loadavg_after": "2", "wall_s": 200.0, "clients": 512, "pairs": 5, "seconds": 15.0,
        "max_queue": 30, "strategy": "thread", "workers": 2, "constant_retry_s": 1.0, "rows": rows, **ratios,
    }
    report = overload.retry_after_markdown(result)
    assert "| 5 | 90 | 100 | 0.90 | 90.0 | 100.0 | 0.90 |" in report
    assert "refused attempts 0.30 [0.10, 0.90], accepted requests/s 0.99 [0.90, 1.20]" in report
    assert "coverage 93.8% with 5 pairs" in report
    assert "- pair 1: 2 s: 10, 10 s: 1" in report  # in the order of the values
    assert "accepted requests/s >= 0.95x the constant's: met by the median only" in report


def test_a_constant_level_without_refusals_counts_as_one() -> None:
    rows = {"computed": _levels([3], [10.0]), "constant": _levels([0], [10.0])}
    assert overload.retry_after_ratios(rows)["refused_ratio"] == [3.0]


def test_the_comparison_settles_past_the_longest_retry_after_and_says_so() -> None:
    from offload_vllm._retry_after import RETRY_AFTER_CAP_S

    assert overload.SETTLE_S > RETRY_AFTER_CAP_S
    rows = {"computed": _levels([3], [10.0]), "constant": _levels([6], [10.0])}
    machine = {"cpus": 2, "platform": "Linux", "date": "today", "commit": "abc", "versions": {}}
    result = {
        "command": "python -m benchmarks overload --compare-retry-after", "machine": machine, "dirty": False,
        "loadavg_before": "1", "loadavg_after": "2", "wall_s": 200.0, "clients": 512, "pairs": 1, "seconds": 15.0,
        "max_queue": 30, "strategy": "thread", "workers": 2, "constant_retry_s": 1.0, "settle_s": 31.0, "rows": rows,
        **overload.retry_after_ratios(rows),
    }
    assert "no traffic for 31 s before each level" in overload.retry_after_markdown(result)


def test_a_negative_settle_is_refused_before_anything_runs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        overload.main(["--compare-retry-after", "--settle", "-1"])
    assert exited.value.code == 2
    assert "--settle must be" in capsys.readouterr().err


def test_a_request_whose_connection_drops_is_counted_not_fatal(answering_server: str) -> None:
    level = asyncio.run(overload._level(answering_server + "/drop", 4, lambda i: {"i": i}, 1.0))
    assert set(level["statuses"]) == {"0"}
    assert level["statuses"]["0"] >= 1  # however slow the machine, the level sent and lost some
    rows = {"computed": [level], "constant": _levels([6], [10.0])}
    machine = {"cpus": 2, "platform": "Linux", "date": "today", "commit": "abc", "versions": {}}
    result = {
        "command": "python -m benchmarks overload --compare-retry-after", "machine": machine, "dirty": False,
        "loadavg_before": "1", "loadavg_after": "2", "wall_s": 200.0, "clients": 4, "pairs": 1, "seconds": 0.3,
        "max_queue": 30, "strategy": "thread", "workers": 2, "constant_retry_s": 1.0, "rows": rows,
        **overload.retry_after_ratios(rows),
    }
    report = overload.retry_after_markdown(result)
    assert f"dropped before an answer (not counted above): pair 1 computed: {level['statuses']['0']}" in report
