"""Run a scenario in a fresh interpreter, bounded by a timeout: a test whose
regression could hang (a fork, an rlimit, a stuck shutdown) fails instead of
hanging the suite."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import offload

from .helpers import TIMEOUT

ROOT = Path(__file__).resolve().parent.parent
#: The `offload` under test (a checkout of older code can be put first on PYTHONPATH).
OFFLOAD_ROOT = Path(offload.__file__).resolve().parent.parent


def run_python(code: str, timeout: float = TIMEOUT, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter that imports this `offload` and `tests`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        dict.fromkeys([str(OFFLOAD_ROOT), str(ROOT), env.get("PYTHONPATH", "")])
    ).rstrip(os.pathsep)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        check=False,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
        **kwargs,
    )


def check(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout
