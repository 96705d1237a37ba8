"""`python -m benchmarks compare`: which steady figures moved beyond the noise."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import compare
from benchmarks.harness import common
from benchmarks.suites import overhead


def _latest_paired() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((common.SNAPSHOT / "paired" / "paired.json").read_text())
    return data


def _scaled(result: dict[str, Any], row: str, part: str, factor: float) -> dict[str, Any]:
    scaled = copy.deepcopy(result)
    for block in scaled["blocks"][row]:
        block["cpu_ms_per_request"][part] *= factor
    return scaled


def test_the_committed_paired_result_against_itself_moves_nothing() -> None:
    latest = _latest_paired()
    figures = compare.paired_figures(latest, latest)
    assert figures
    assert not [f.name for f in figures if f.moved]


def test_a_paired_figure_twice_as_high_is_a_move_and_says_which() -> None:
    latest = _latest_paired()
    figures = {f.name: f for f in compare.paired_figures(latest, _scaled(latest, "thread", "loop", 2.0))}
    assert figures["paired, thread: loop-thread CPU ms/request"].verdict == "**moved: higher** (worse)"
    assert figures["paired, thread: loop-thread CPU ms/request / vLLM default's (per round)"].moved
    # The other rows and parts were not touched.
    assert not figures["paired, process: loop-thread CPU ms/request"].moved
    assert not figures["paired, thread: API-server CPU ms/request"].moved


def test_a_paired_figure_a_few_percent_off_is_within_the_noise() -> None:
    latest = _latest_paired()
    figures = compare.paired_figures(latest, _scaled(latest, "thread", "loop", 1.03))
    assert not [f.name for f in figures if f.moved]


def test_overhead_figures_compare_rounds_and_per_round_ratios() -> None:
    before = {"no-op": {"offload thread": [50e-6] * 5, "run_in_executor": [80e-6] * 5}}
    slower = {"no-op": {"offload thread": [90e-6] * 5, "run_in_executor": [80e-6] * 5}}
    figures = {f.name: f for f in compare.overhead_figures({"rounds_seconds_per_call": before}, slower)}
    assert figures["overhead, no-op: offload thread (µs/call)"].moved
    assert figures["overhead, no-op: offload thread / run_in_executor (per round)"].moved
    assert not figures["overhead, no-op: run_in_executor (µs/call)"].moved
    text = compare.report(list(figures.values()), [])
    assert text.startswith("2 of 3 figures moved beyond the noise: overhead, no-op: offload thread")


def test_compare_smoke_run_against_a_baseline_made_here(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert overhead.main(["--smoke", "--out", str(tmp_path / "overhead")]) == 0
    capsys.readouterr()
    assert compare.main(["--smoke", "--baseline", str(tmp_path), "--out", str(tmp_path / "compare.md")]) == 0
    out = capsys.readouterr().out
    assert "figures" in out.splitlines()[0]
    assert "| overhead, no-op: offload thread / run_in_executor (per round) |" in out
    assert (tmp_path / "compare.md").read_text() in out


def test_a_baseline_of_medians_only_is_a_point_outside_or_inside_this_runs_interval() -> None:
    latest = {"seconds_per_call": {"no-op": {"offload thread": 50e-6, "run_in_executor": 80e-6}}}
    now = {"no-op": {"offload thread": [52e-6, 55e-6, 60e-6, 58e-6, 61e-6], "run_in_executor": [80e-6] * 5}}
    figures = {f.name: f for f in compare.overhead_figures(latest, now)}
    assert figures["overhead, no-op: offload thread (µs/call)"].verdict == "**moved: higher** (worse)"
    assert not figures["overhead, no-op: run_in_executor (µs/call)"].moved
    assert "50.0 (median only)" in compare.report(list(figures.values()), [])
    # The committed result (medians only, from before the rounds were kept) compares too.
    committed = json.loads((common.SNAPSHOT / "overhead" / "overhead.json").read_text())
    assert compare.overhead_figures(committed, now)
