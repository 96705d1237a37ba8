"""What the calibration suites share (`benchmarks/harness/unit_cost.py`)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from benchmarks.calibration import echo_cost, render_cost


@pytest.mark.parametrize("suite", [echo_cost, render_cost], ids=["echo-cost", "render-cost"])
@pytest.mark.parametrize("flag", ["--rounds", "--repeats"])
def test_rounds_and_repeats_must_be_positive(
    suite: ModuleType, flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        suite.main([flag, "0", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "--rounds and --repeats must be at least 1" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
