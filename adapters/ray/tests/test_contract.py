"""offload's contract suite (`offload.testing.StrategyContract`) against the
`ray` strategy: every executor the suite builds joins the one local Ray
instance started for it (`conftest.local_ray`), as an application that
already called `ray.init` would."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from offload.testing import StrategyContract

pytestmark = pytest.mark.usefixtures("local_ray")


class TestRayContract(StrategyContract):
    strategy_name = "ray"

    @pytest.mark.timeout(300)
    def test_an_executor_used_before_fork_serves_the_child(self, strategy: str) -> None:
        """The contract's fork case, run in a pytest process of its own. A Ray
        driver that forked cannot count on Ray's GCS afterwards (seen with Ray
        2.60: after this case, a new actor never started in the same process),
        so every test after this one there would hang."""
        if os.environ.get(_FORK_CASE_ALONE):
            super().test_an_executor_used_before_fork_serves_the_child(strategy)
            return
        node = f"{__file__}::TestRayContract::test_an_executor_used_before_fork_serves_the_child"
        done = subprocess.run(
            [sys.executable, "-m", "pytest", node, "-q", "-p", "no:cacheprovider", "-o", "timeout_method=thread"],
            check=False, env={**os.environ, _FORK_CASE_ALONE: "1"}, capture_output=True, text=True, timeout=240,
        )
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        assert "1 passed" in done.stdout, done.stdout[-4000:]


#: Set in the process that runs the fork case alone.
_FORK_CASE_ALONE = "OFFLOAD_RAY_TEST_FORK_CASE_ALONE"
