"""The generate benchmark's open-loop client against a loopback server, and its verdicts (no vLLM)."""

from __future__ import annotations

import asyncio
import json

import pytest

from benchmarks.suites import generate


def _run(url: str, arrivals: list[float]) -> dict[str, object]:
    return asyncio.run(generate._open_loop(url, [b"{}"], arrivals))


def test_a_request_unanswered_past_the_client_timeout_counts_as_timed_out(
    answering_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(generate, "CLIENT_TIMEOUT_S", 0.3)
    level = _run(answering_server + "/hang", [0.0, 0.05])
    assert level["ended"] == {"timeout": 2}
    assert level["timeout_share"] == 1.0
    assert level["error_share"] == 0.0


def test_answers_are_timed_to_their_first_byte_and_refusals_are_errors(answering_server: str) -> None:
    ok = _run(answering_server + "/slow", [0.0, 0.1])
    assert ok["ended"] == {"200": 2}
    assert 400 <= float(ok["ttft_mean_ms"]) < 5000  # type: ignore[arg-type]  # /slow answers after 0.5 s
    refused = _run(answering_server + "/busy", [0.0])
    assert refused["ended"] == {"503": 1}
    assert refused["error_share"] == 1.0


def test_every_chat_streams_and_the_mixed_workload_carries_each_image_size() -> None:
    bodies = [json.loads(b) for b in generate.chat_bodies("m", count=30, text_only=False)]
    assert all(b["stream"] and b["max_tokens"] == generate.MAX_TOKENS for b in bodies)
    with_image = [b for b in bodies if isinstance(b["messages"][0]["content"], list)]
    assert 0 < len(with_image) < len(bodies)
    urls = {b["messages"][0]["content"][0]["image_url"]["url"] for b in with_image}
    assert len(urls) == len(with_image)  # each image new: no cache answers for any row
    assert not any(isinstance(json.loads(b)["messages"][0]["content"], list)
                   for b in generate.chat_bodies("m", count=10, text_only=True))


def _interval(median: float, low: float | None = None, high: float | None = None) -> dict[str, float]:
    return {"median": median, "low": median if low is None else low, "high": median if high is None else high}


def test_the_verdicts_follow_the_intervals() -> None:
    base = generate.level_key("mixed", 20, generate.BASELINE)
    process = generate.level_key("mixed", 20, "offload process")
    summary = {
        generate.level_key("mixed", 10, generate.BASELINE): {"timeout_share": _interval(0.0)},
        base: {"timeout_share": _interval(0.1)},
        process: {"health_p99_ms": _interval(4, 3, 12), "ttft_p99_ratio": _interval(0.3, 0.2, 0.4),
                  "timeout_share": _interval(0.0)},
        generate.level_key("text", 10, "offload thread"): {"ttft_p99_ratio": _interval(1.1, 1.05, 1.2)},
    }
    said = "\n".join(generate.goals(summary, [10, 20], 10))
    assert "`process` at 20/s: 4.0 [3.0, 12.0] ms, **not met by the interval**" in said
    assert "0.5x vLLM default's at 20/s, where the default first times out: 0.30 [0.20, 0.40], **met**" in said
    assert "`thread` TTFT p99 / default's: 1.10 [1.05, 1.20] (outside the interval" in said


def test_rows_default_to_all_but_the_variants_and_rows_pick_them_with_vllms_default() -> None:
    every, health = generate.configs(False)
    assert generate.BASELINE in every
    assert not set(generate.VARIANT_ROWS) & set(every)
    assert set(health) == {f"offload {s}" for s in generate.OFFLOAD_ROWS}
    picked, health = generate.configs(False, ["offload process", "offload process nice 0"])
    assert list(picked) == [generate.BASELINE, "offload process", "offload process nice 0"]
    assert set(health) == {"offload process", "offload process nice 0"}
    assert picked["offload process nice 0"].strategy == "process"
    assert picked["offload process nice 0"].env["OFFLOAD_VLLM_WORKER_NICE"] == "0"
    assert "OFFLOAD_VLLM_WORKER_NICE" not in picked["offload process"].env
    assert set(generate.ROW_NAMES) == set(every) | set(generate.VARIANT_ROWS)
