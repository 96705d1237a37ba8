"""The paired suite's report from made-up rounds (no vLLM)."""

from __future__ import annotations

from typing import Any

from benchmarks.suites import paired


def _block(scale: float) -> dict[str, Any]:
    return {
        "requests": 100, "errors": 0, "first_error": None, "requests_per_s": 10 * scale, "p50_ms": 5.0,
        "p99_ms": 9 * scale, "health_p99_ms": 3 * scale,
        "cpu_ms_per_request": dict.fromkeys(paired.PART_NAMES, scale),
        "new_workers": 0,
        "client_cpu_ms_per_request": 0.5 * scale,
    }


def test_rows_are_paired_per_round_with_vllms_default() -> None:
    blocks = {
        paired.DEFAULT: [_block(1.0), _block(2.0), _block(3.0)],
        "process": [_block(2.0), _block(4.0), _block(6.0)],  # twice the default's, round by round
    }
    summary = paired.summarize(blocks)
    ratio = summary["process"]["ratio"]["health_p99_ms"]
    assert (ratio["median"], ratio["low"], ratio["high"]) == (2.0, 2.0, 2.0)
    assert summary[paired.DEFAULT]["ratio"] == {}  # not against itself
    result = {
        "argv": ["--workload", "truncated"], "machine": "2 CPUs", "started": "today", "clients": 64, "rounds": 3,
        "seconds": 8.0, "blocks": blocks, "startup_s": 60.0, "workload": "truncated", "summary": summary,
        "commit": "abc1234", "dirty": False,
    }
    assert "| process |" in paired.markdown(result)


def test_the_report_names_the_commit_it_measured_and_a_dirty_tree() -> None:
    blocks = {paired.DEFAULT: [_block(1.0)], "thread": [_block(2.0)]}
    result: dict[str, Any] = {
        "argv": [], "machine": "2 CPUs", "started": "today", "clients": 8, "rounds": 1, "seconds": 8.0,
        "blocks": blocks, "startup_s": 60.0, "workload": "tiny", "summary": paired.summarize(blocks),
    }
    result.update(commit="abc1234", dirty=False)
    assert "today, commit `abc1234`:" in paired.markdown(result)
    result.update(dirty=True)
    assert "today, commit `abc1234 (dirty tree)`:" in paired.markdown(result)
