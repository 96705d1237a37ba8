"""The overload suite's flood: its clients, timeouts and `/ready` agreement against a loopback server (no vLLM)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from benchmarks.suites import overload


def _level(url: str, seconds: float, ready: str | None, timeout_s: float = 5.0) -> dict[str, Any]:
    return asyncio.run(overload.flood_level(url, [b"{}"], 2, seconds, ready, timeout_s))


def test_a_request_unanswered_past_the_client_timeout_counts_as_a_timeout(answering_server: str) -> None:
    level = _level(answering_server + "/hang", 0.5, None, timeout_s=0.3)
    assert set(level["statuses"]) == {"timeout"}
    assert level["statuses"]["timeout"] >= 2
    assert math.isnan(level["accepted_p99_ms"]) or level["accepted_p99_ms"] == 0


def test_a_refused_client_waits_its_retry_after_and_readiness_agrees(answering_server: str) -> None:
    # /retry: 503 with Retry-After 0.3; /busy answers 503, as /ready does when full.
    level = _level(answering_server + "/retry", 1.2, answering_server + "/busy")
    refused = level["statuses"]["503"]
    assert set(level["statuses"]) == {"503"}
    assert 4 <= refused <= 12  # two clients, one request per 0.3 s each (not hundreds)
    assert level["ready"]["agreement"] == 1.0
    assert level["ready"]["decisions"] == refused  # the clients start once the first probe is answered
    assert level["probes_503"] == level["probes"] > 0


def test_admissions_while_ready_says_full_disagree(answering_server: str) -> None:
    level = _level(answering_server + "/ok", 0.5, answering_server + "/busy")
    assert level["statuses"]["200"] > 0
    assert level["ready"]["agreement"] == 0.0
    assert level["accepted_p50_ms"] < 1000


def test_agreement_counts_each_request_against_the_probe_before_it() -> None:
    probes = [(1.0, 200), (2.0, 503), (3.0, 200)]
    requests = [(0.5, "200"), (1.5, "200"), (2.5, "503"), (2.6, "timeout"), (3.5, "503")]
    assert overload.agreement(requests, probes) == {"decisions": 4.0, "agreement": 0.5}
    assert math.isnan(overload.agreement([(0.1, "200")], probes)["agreement"])


def test_the_adapters_decisions_are_read_from_its_metrics_page() -> None:
    page = (
        "# HELP offload_vllm_readiness_at_admission_total x\n"
        "# TYPE offload_vllm_readiness_at_admission_total counter\n"
        'offload_vllm_readiness_at_admission_total{decision="admitted",ready="200"} 7.0\n'
        'offload_vllm_readiness_at_admission_total{decision="refused",ready="503"} 3.0\n'
        'offload_vllm_readiness_at_admission_total{decision="refused",ready="200"} 1.0\n'
        "# TYPE other_total counter\n"
        "other_total 5.0\n"
    )
    assert overload.decisions_counted(page) == {"admitted 200": 7.0, "refused 503": 3.0, "refused 200": 1.0}


def test_the_flood_rows_are_vllm_alone_its_engine_bound_and_the_docs_settings_with_and_without_it() -> None:
    configs, ready = overload.flood_configs((8123, 8124))
    (alone, queued, ours, ours_queued) = configs.values()
    engine_bound = ("--max-num-queued-reqs", str(overload.VLLM_QUEUED_REQS))
    assert alone.strategy is None
    assert alone.extra_args == ()
    assert queued.extra_args == engine_bound
    assert ours.strategy == ours_queued.strategy == "thread"
    assert ours.extra_args == ("--offload-max-queued-cost", "2000000", "--offload-health-port", "8123")
    assert ours_queued.extra_args == ("--offload-max-queued-cost", "2000000", "--offload-health-port", "8124",
                                      *engine_bound)
    names = list(configs)
    assert ready == {names[2]: "http://127.0.0.1:8123/ready", names[3]: "http://127.0.0.1:8124/ready"}


def test_the_report_sums_each_ending_and_gives_both_agreements() -> None:
    level = {"statuses": {"200": 5, "503": 3, "timeout": 1, "error": 1}, "accepted_p50_ms": 100.0,
             "accepted_p99_ms": 900.0, "accepted_max_ms": 950.0}
    ours = {**level, "ready": {"decisions": 9.0, "agreement": 0.9}, "counted_agreement": 0.95}
    result = {"argv": ["--scenario", "flood"], "machine": "m", "started": "s", "model": "minilm", "clients": 64,
              "texts": 16, "chars": 9700, "rounds": 2, "seconds": 20.0,
              "rows": {"vLLM alone": [level, level], "offload": [ours, ours]}}
    text = overload.flood_markdown(result)
    assert "| vLLM alone | 10 | 6 | 2 | 2 | 100 [100, 100] | 900 [900, 900] | 950 [950, 950] | – | – |" in text
    assert "| 0.950 [0.950, 0.950] | 0.900 [0.900, 0.900] |" in text
