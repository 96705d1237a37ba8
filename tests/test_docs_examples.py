"""Every code example in the docs is a file, and every file runs: docs cannot describe code that no longer works."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.py"))
QUICK_FLAG = {"loop_lag_demo.py": ["--quick"]}
#: Examples another test runs already, with more checks: vllm_offline.py runs in
#: tests/vllm/test_offline.py under every strategy, its output compared with
#: sentence-transformers' and a server's.
RUN_ELSEWHERE = {"vllm_offline.py": "tests/vllm/test_offline.py"}


@pytest.mark.timeout(330)
@pytest.mark.parametrize("example", [p for p in EXAMPLES if p.name not in RUN_ELSEWHERE], ids=lambda p: p.name)
def test_example_runs(example: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    env.pop("OFFLOAD_STRATEGY", None)
    result = subprocess.run(
        [sys.executable, str(example), *QUICK_FLAG.get(example.name, [])],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip(), "an example should show what it did"


def test_every_example_is_included_in_a_page() -> None:
    pages = "\n".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))
    for example in EXAMPLES:
        assert f"docs/examples/{example.name}" in pages, f"{example.name} is not shown on any page"
