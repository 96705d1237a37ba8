"""Every benchmark script runs once in its tiny smoke mode, so none can rot.

Convention: each `benchmarks/bench_*.py` is a plain script with `main(argv) -> int`
that accepts `--smoke` (seconds, not minutes; results go to a temp directory
given by `--out`). A script whose smoke run must start a real server says how
long it may take in a module constant `SMOKE_TIMEOUT_S` (read without importing it).
"""

from __future__ import annotations

import ast
import importlib
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _smoke_timeout(path: Path) -> int | None:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "SMOKE_TIMEOUT_S" for t in node.targets
        ):
            return int(ast.literal_eval(node.value))
    return None


def _params() -> list[object]:
    params: list[object] = []
    for path in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        timeout = _smoke_timeout(path)
        marks = [pytest.mark.timeout(timeout), pytest.mark.e2e] if timeout else []
        params.append(pytest.param(path.stem, marks=marks, id=path.stem))
    return params


@pytest.mark.parametrize("script", _params())
def test_benchmark_runs_in_smoke_mode(script: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    module = importlib.import_module(f"benchmarks.{script}")
    assert module.main(["--smoke", "--out", str(tmp_path)]) == 0
    written = os.listdir(tmp_path)
    assert any(name.endswith(".json") for name in written), written
