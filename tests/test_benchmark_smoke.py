"""Every benchmark script runs once in its tiny smoke mode, so none can rot.

Convention: each `benchmarks/bench_*.py` is a plain script with `main(argv) -> int`
that accepts `--smoke` (seconds, not minutes; results go to a temp directory
given by `--out`).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.stem for p in (ROOT / "benchmarks").glob("bench_*.py"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_runs_in_smoke_mode(script: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    module = importlib.import_module(f"benchmarks.{script}")
    assert module.main(["--smoke", "--out", str(tmp_path)]) == 0
    written = os.listdir(tmp_path)
    assert any(name.endswith(".json") for name in written), written
