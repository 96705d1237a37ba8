"""The overload benchmark's load level against a loopback server (no vLLM)."""

from __future__ import annotations

from benchmarks.harness import mixed
from benchmarks.suites import overload


def test_a_request_whose_connection_drops_is_counted_not_fatal(answering_server: str) -> None:
    level = overload.run_level(answering_server + "/drop", 4, [b"{}"], 1.0)
    assert set(level["statuses"]) == {"0"}
    assert level["statuses"]["0"] >= 1  # however slow the machine, the level sent and lost some



def test_a_refused_client_waits_the_retry_after_it_was_told(answering_server: str) -> None:
    mixed.run_for(answering_server + "/ok", [b"{}"], 1, 0.1)  # aiohttp imported before the level's clock
    level = overload.run_level(answering_server + "/retry", 1, [b"{}"], 2.0)
    # One client told to wait 0.3 s after each refusal: a few requests in 2 s, where /busy's 503s
    # without the header come back to back (hundreds).
    assert 1 <= level["statuses"].get("503", 0) <= 8
