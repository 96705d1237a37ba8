"""The GPU benchmark's report, from made-up rounds: medians with intervals,
per-round ratios to the baseline, and figures a machine could not read."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.harness import library
from benchmarks.suites import gpu as bench_gpu


def _row(items: float, lag: float, gpu: float | None) -> dict[str, Any]:
    return {"items_per_s": items, "gpu_util": gpu, "cpu_ms_per_item": 1.0, "busy_fraction": 0.5,
            "lag_p99_ms": lag, "lag_max_ms": lag * 2}


def _report(gpu: float | None) -> str:
    rounds = [{"process": _row(200.0 * k, 2.0, gpu), library.BASELINE: _row(100.0 * k, 20.0, gpu)} for k in (1, 2, 3)]
    return bench_gpu.report(["process", library.BASELINE], rounds)


def test_the_report_gives_medians_and_paired_ratios_to_the_baseline() -> None:
    text = _report(0.25)
    assert "| process | 400 [200, 600] | 0.25 [0.25, 0.25] |" in text
    paired = text.split("Paired per round")[1]
    # items/s twice the baseline's and a tenth of its lag, in every round.
    assert "| process | 2.00 [2.00, 2.00]x | 1.00 [1.00, 1.00]x | 1.00 [1.00, 1.00]x | 0.10 [0.10, 0.10]x |" in paired
    assert f"| {library.BASELINE} |" not in paired


def test_a_figure_the_machine_could_not_read_is_not_a_number() -> None:
    text = _report(None)
    assert "| process | 400 [200, 600] | n/a |" in text
    assert "| process | 2.00 [2.00, 2.00]x | n/a |" in text.split("Paired per round")[1]


def test_bad_arguments_are_refused_before_anything_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_gpu.main(["--smoke", "--rounds", "0", "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert "--rounds must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        bench_gpu.main(["--smoke", "--strategies", "nope", "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert "unknown rows ['nope']" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # no results written


def test_the_committed_gpu_run_reports_what_its_rounds_hold() -> None:
    """The committed H200 run's tables are what `report` makes of its own rounds:
    neither the figures nor the report code drifted. (The run predates the
    rows' list in `meta`; its per-row lists name them.)"""
    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "latest" / "gpu"
    data = json.loads((results / "gpu_library.json").read_text())
    names = data["meta"].get("rows") or list(data["rows"])
    assert bench_gpu.report(names, data["rounds"]) in (results / "gpu_library.md").read_text()


def test_without_nvml_the_gpu_figure_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    sampler = bench_gpu.GpuUtilization("cuda")
    assert not sampler.is_alive()  # nothing sampled, no thread left behind
    assert sampler.stop() is None
    assert bench_gpu.GpuUtilization("cpu").stop() is None
