"""The overload benchmark's load level against a loopback server (no vLLM)."""

from __future__ import annotations

from benchmarks.suites import overload


def test_a_request_whose_connection_drops_is_counted_not_fatal(answering_server: str) -> None:
    level = overload.run_level(answering_server + "/drop", 4, [b"{}"], 1.0)
    assert set(level["statuses"]) == {"0"}
    assert level["statuses"]["0"] >= 1  # however slow the machine, the level sent and lost some

