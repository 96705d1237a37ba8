"""The ray benchmark runs once in its smoke mode here, where Ray is installed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import ray


# Starts Ray, then process workers and actors that import transformers.
@pytest.mark.timeout(600)
@pytest.mark.usefixtures("no_local_ray")
def test_bench_ray_runs_in_smoke_mode(tmp_path: Path) -> None:
    from benchmarks.suites import ray_cost as bench_ray

    assert not ray.is_initialized()
    assert bench_ray.main(["--smoke", "--out", str(tmp_path)]) == 0
    assert "ray.json" in os.listdir(tmp_path)
