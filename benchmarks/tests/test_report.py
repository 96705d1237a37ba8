"""The end-to-end benchmark's report: tables in the seeds' layout and target verdicts, from made-up numbers."""

from __future__ import annotations

from typing import Any

from benchmarks.harness import report


def level(clients: int, rps: float, health_p99: float) -> dict[str, Any]:
    return {
        "clients": clients, "requests": 100, "errors": 0, "duration_s": 1.0,
        "tokens_per_s": rps * 170, "requests_per_s": rps, "mean_ms": 1e3 * clients / rps,
        "p50_ms": 1.0, "p99_ms": 2.0,
        "health": {"count": 10.0, "mean_ms": 1.0, "p50_ms": 0.5, "p99_ms": health_p99, "max_ms": health_p99},
    }


def row(strategy: str | None, rps: dict[int, float], health: float) -> dict[str, Any]:
    return {"strategy": strategy, "status": "ok",
            "sweep": [level(c, r, health) for c, r in rps.items()],
            "overhead_online": {"mean_ms": 3.5, "p50_ms": 3.4}}


def workload() -> dict[str, Any]:
    return {"rows": {
        "offload inline": row("inline", {1: 100, 64: 200, 128: 200}, 150.0),
        "offload thread": row("thread", {1: 99, 64: 400, 128: 400}, 2.0),
        "offload process": {"strategy": "process", "status": "skipped: strategy not available"},
        report.DEFAULT_ROW: row(None, {1: 100, 64: 300, 128: 300}, 100.0),
    }}


def test_targets_compare_the_best_strategy_with_vllm_default() -> None:
    verdicts = {t["target"]: t for t in report.targets(workload())}
    high = verdicts["best strategy >= 1.2x vLLM default at 64 clients"]
    assert high["status"] == "met"
    assert "offload thread" in high["detail"]
    assert "1.33x" in high["detail"]
    assert verdicts["best strategy >= 0.97x vLLM default at 1 clients"]["status"] == "met"
    assert verdicts["offload thread: /health p99 <= 5.0 ms at 128 clients"]["status"] == "met"
    assert verdicts["inline shows the blocked loop at 128 clients"]["status"] == "met"


def test_targets_not_measured_without_offload_rows() -> None:
    wl = {"rows": {report.DEFAULT_ROW: row(None, {1: 100, 64: 300}, 100.0)}}
    assert {t["status"] for t in report.targets(wl)} == {"not measured"}


def test_sweep_table_has_one_line_per_level_and_two_columns_per_row() -> None:
    lines = report.sweep_table(workload()).splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[0] == "n_clients"
    assert len(header) == 1 + 2 * 3  # the skipped row has no columns
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["1", "64", "128"]
