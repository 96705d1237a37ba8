"""Every benchmark script runs once in its tiny smoke mode, so none can rot.

Convention: each `benchmarks/bench_*.py` is a plain script with `main(argv) -> int`
that accepts `--smoke` (seconds, not minutes; results go to a temp directory
given by `--out`). A script whose smoke run must start a real server says how
long it may take in a module constant `SMOKE_TIMEOUT_S`, and one that needs an
optional package names its modules in `REQUIRES` (both read without importing it):
it is skipped where they are missing (`bench_ray` runs in the ray suite).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _constant(path: Path, name: str) -> object:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    return None


def _params() -> list[object]:
    params: list[object] = []
    for path in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        timeout = _constant(path, "SMOKE_TIMEOUT_S")
        marks = [pytest.mark.timeout(int(timeout)), pytest.mark.e2e] if timeout else []
        missing = [m for m in _constant(path, "REQUIRES") or () if importlib.util.find_spec(m) is None]
        if missing:
            marks.append(pytest.mark.skip(reason=f"needs {', '.join(missing)} (not installed here)"))
        params.append(pytest.param(path.stem, marks=marks, id=path.stem))
    return params


@pytest.mark.parametrize("script", _params())
def test_benchmark_runs_in_smoke_mode(script: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    module = importlib.import_module(f"benchmarks.{script}")
    assert module.main(["--smoke", "--out", str(tmp_path)]) == 0
    written = os.listdir(tmp_path)
    assert any(name.endswith(".json") for name in written), written
