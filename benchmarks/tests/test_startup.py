"""The start-up suite's parts that need no vLLM: its summary and report from made-up rounds."""

from __future__ import annotations

from benchmarks.suites import startup


def _block(ready_s: float, workers: float, pss_workers: float) -> dict[str, float]:
    return {
        "ready_s": ready_s, "first_small_ms": 20.0, "first_heavy_ms": 200.0, "pss_api": 400.0,
        "pss_workers": pss_workers, "pss_engine": 900.0, "rss_api": 700.0, "rss_workers": 2 * pss_workers,
        "worker_processes": workers, "api_threads": 40.0,
    }


def test_the_report_pairs_each_round_with_its_baseline() -> None:
    blocks = {
        startup.DEFAULT: [_block(40.0, 0, 0.0), _block(44.0, 0, 0.0), _block(42.0, 0, 0.0)],
        "thread defaults": [_block(41.0, 0, 0.0), _block(45.0, 0, 0.0), _block(43.0, 0, 0.0)],
        "process defaults": [_block(46.0, 2, 300.0), _block(50.0, 2, 300.0), _block(48.0, 2, 300.0)],
    }
    summary = startup.summarize(blocks)
    assert summary["values"]["process defaults"]["ready_s"]["median"] == 48.0
    pairs = {(p["row"], p["baseline"]): p for p in summary["pairs"]}
    # Paired per round: 46 - 41, 50 - 45, 48 - 43.
    diff = pairs["process defaults", "thread defaults"]["ready_s_diff"]
    assert (diff["median"], diff["low"], diff["high"]) == (5.0, 5.0, 5.0)
    assert pairs["process defaults", "thread defaults"]["pss_api_workers_diff"]["median"] == 300.0
    assert pairs["thread defaults", startup.DEFAULT]["ready_ratio"]["median"] == 43.0 / 42.0
    result = {
        "command": "python -m benchmarks startup", "machine": {
            "cpus": 2, "platform": "Linux", "date": "today", "commit": "abc", "versions": {"vllm": "0.32.0"},
        },
        "dirty": False, "loadavg_before": "1 1 1", "loadavg_after": "2 2 2", "rounds": 3, "wall_s": 400.0,
        "summary": summary, "servers": {row: f"python -m {row}" for row in blocks},
    }
    report = startup.markdown(result)
    assert "| process defaults | thread defaults | 5.0 [5.0, 5.0] |" in report
    assert "| process defaults | 48.0 [46.0, 50.0] |" in report
