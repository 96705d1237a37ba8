"""Every suite runs once in its tiny smoke mode, so none can rot.

Convention: each suite in `benchmarks/registry.py` is a module with
`main(argv) -> int` that accepts `--smoke` (seconds, not minutes; results go
to a temp directory given by `--out`). A suite whose smoke run must start a
real server says how long it may take in a module constant `SMOKE_TIMEOUT_S`
(read without importing it); one that needs an optional package names it in
the registry's `requires`, and is skipped where it is missing (`ray` runs in
the ray suite, adapters/ray/tests/test_bench_smoke.py). A suite whose smoke
output is checked by a test of its own is listed in `OWN_SMOKE_TEST` and not
run twice.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
from pathlib import Path

import pytest

from benchmarks.registry import SUITES
from benchmarks.suites import mixed as bench_mixed

ROOT = Path(__file__).resolve().parents[2]
OWN_SMOKE_TEST = {
    "mixed": "test_mixed_traffic_smoke_run_is_sane",
    "paired": "test_paired_workloads_on_other_models_run_in_smoke_mode",
}
#: A suite that starts no server may still start worker processes that import
#: heavy libraries (as the image suite's imported transformers): beside the vLLM
#: suite, at a load of about 10 on two cores, that took over the 120 s that
#: stop a hung test elsewhere (44 s at a load of 14 without memory pressure).
NO_SERVER_TIMEOUT_S = 300


def _constant(path: Path, name: str) -> object:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    return None


def _source(module: str) -> Path:
    return ROOT / (module.replace(".", "/") + ".py")


def _params() -> list[object]:
    params: list[object] = []
    for suite in SUITES:
        if suite.name in OWN_SMOKE_TEST:
            continue
        timeout = _constant(_source(suite.module), "SMOKE_TIMEOUT_S")
        marks = [pytest.mark.timeout(int(timeout)), pytest.mark.e2e] if timeout else [pytest.mark.timeout(NO_SERVER_TIMEOUT_S)]
        missing = [m for m in suite.requires if importlib.util.find_spec(m) is None]
        if missing:
            marks.append(pytest.mark.skip(reason=f"needs {', '.join(missing)} (not installed here)"))
        params.append(pytest.param(suite.module, marks=marks, id=suite.name))
    return params


@pytest.mark.parametrize("module", _params())
def test_suite_runs_in_smoke_mode(module: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert importlib.import_module(module).main(["--smoke", "--out", str(tmp_path)]) == 0
    written = os.listdir(tmp_path)
    assert any(name.endswith(".json") for name in written), written


_PAIRED = _source("benchmarks.suites.paired")


@pytest.mark.e2e
@pytest.mark.timeout(int(_constant(_PAIRED, "SMOKE_TIMEOUT_S")))
@pytest.mark.parametrize(("workload", "row"), [("rerank", "thread"), ("multilingual", "process")])
def test_paired_workloads_on_other_models_run_in_smoke_mode(
    workload: str, row: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The paired suite's smoke run (its own, as `OWN_SMOKE_TEST` says): the
    workloads on their own tiny models (a cross-encoder's `/rerank`, an
    XLM-R-style tokenizer's embeddings), at smoke size, between them on a
    thread and a process row (the process row's worker CPU included): each
    runs, and every row answered as vLLM's default did. The default `tiny`
    workload's bodies are the overload suite's, whose smoke run sends them."""
    pytest.importorskip("sentencepiece")
    from benchmarks.suites import paired

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = ["--smoke", "--workload", workload, "--rows", row, "--out", str(tmp_path)]
    assert paired.main(argv) == 0
    result = json.loads((tmp_path / f"paired-{workload}.json").read_text())
    assert result["same_answers"] == {"vLLM default": True, row: True}
    assert all(block["errors"] == 0 for blocks in result["blocks"].values() for block in blocks)


_MIXED = _source(bench_mixed.__name__)


@pytest.mark.e2e
@pytest.mark.timeout(int(_constant(_MIXED, "SMOKE_TIMEOUT_S")))
def test_mixed_traffic_smoke_run_is_sane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One round of both phases on vLLM default and thread, with the defaults (Poisson
    small requests, idle servers paused): every kind of request was sent and answered,
    none lost or unsent, the paused server used next to no CPU, and a verdict computed
    for each target."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert bench_mixed.main(["--smoke", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "mixed-preprocess.json").read_text())
    assert set(result["blocks"]) == set(bench_mixed.SMOKE_ROWS)
    assert result["small"]["rate"] == bench_mixed.SMALL_RATE
    for row, summary in result["summary"]["rows"].items():
        for kind, counts in summary["counts"].items():
            assert counts["sent"] > 0, (row, kind)
            assert counts["statuses"].get("200", 0) > 0, (row, kind)
            assert counts["lost"] == 0, (row, kind)
            assert counts["unsent"] == 0, (row, kind)
        assert all(n > 0 for sent in summary["small_sent"].values() for n in sent), row
        assert summary["values"]["p50_ratio"]["median"] > 0
        assert summary["values"]["heavy_per_s"]["median"] > 0
        for phase in ("alone", "flooded"):
            # Paused: 0 but for the odd clock tick; a running idle server burns a good part of a core.
            assert [b["idle_cpu_per_s"][phase] < 0.5 for b in result["blocks"][row]] == [True], (row, phase)
    assert result["summary"]["pairs"]
    assert result["targets"]
    assert all(t["met"] is not None for t in result["targets"])
    report = (tmp_path / "mixed-preprocess.md").read_text()
    for section in ("meta", "tables", "targets"):
        assert f"[start:{section}]" in report
    assert "Poisson arrivals" in report
    assert "CPU of the servers not being measured (idle servers paused" in report
