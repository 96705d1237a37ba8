"""The overload benchmark's parts that need no vLLM: readiness beside admission
(`--readiness`) from made-up levels, as the clients saw it and as the server
counted it at each decision."""

from __future__ import annotations

import asyncio

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


def test_a_request_whose_connection_drops_is_counted_not_fatal(answering_server: str) -> None:
    level = asyncio.run(overload._level(answering_server + "/drop", 4, lambda i: {"i": i}, 1.0))
    assert set(level["statuses"]) == {"0"}
    assert level["statuses"]["0"] >= 1  # however slow the machine, the level sent and lost some

