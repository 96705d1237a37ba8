"""`bench_pricing`'s bad arguments are refused before anything is measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.calibration import pricing as bench_pricing


@pytest.mark.parametrize("flag", ["--rounds", "--repeats"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_rounds_and_repeats_must_be_positive(
    flag: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench_pricing.main([flag, value, "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "--rounds and --repeats must be at least 1" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing measured, nothing written
