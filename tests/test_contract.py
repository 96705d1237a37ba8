"""offload's contract suite (`offload.testing.StrategyContract`) against every
registered strategy and the docs' examples (see `conftest.strategies_under_test`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import offload
from offload.testing import StrategyContract

from .conftest import POOL_EXAMPLE, strategies_under_test


class TestContract(StrategyContract):
    @pytest.fixture(params=strategies_under_test())
    def strategy(self, request: pytest.FixtureRequest) -> str:
        return str(request.param)

    def strategy_options(self, strategy: str) -> dict[str, Any]:
        if strategy == "async-renderer":
            # One call at a time unless calls share a batch form: capacity() is the batch size.
            return {"max_batch_size": 1}
        return super().strategy_options(strategy)


@pytest.mark.skipif(
    bool(os.environ.get("OFFLOAD_TEST_STRATEGIES", "").strip()),
    reason="OFFLOAD_TEST_STRATEGIES names the strategies under test",
)
class TestPoolExample(StrategyContract):
    """docs/examples/pool_strategy.py, as its author would check it; on asyncio
    only (a strategy never touches the event loop, and its workers are slow to
    spawn: the other backends are the built-ins' business)."""

    strategy_name = POOL_EXAMPLE

    @pytest.fixture
    def anyio_backend(self) -> Any:
        return ("asyncio", {})


class TestContractWithExpress(StrategyContract):
    """`thread` and `process` with the express worker taking every call of
    the suite's default cost (1): `capacity()` counts it, and every contract
    (cancellation, shutdown, errors, the bound) holds with it."""

    @pytest.fixture(params=[s for s in ("thread", "process") if s in strategies_under_test()])
    def strategy(self, request: pytest.FixtureRequest) -> str:
        return str(request.param)

    def strategy_options(self, strategy: str) -> dict[str, Any]:
        return {**super().strategy_options(strategy), "express_cost": 1}

    @pytest.fixture
    def anyio_backend(self) -> Any:
        # The express slot is the dispatcher's, which never touches the event
        # loop: the backends are the plain suite's business.
        return ("asyncio", {})


_WRONG_STRATEGY = '''
from offload.strategy import Strategy


class WrongAnswer(Strategy):
    """Answers 6 to every call."""

    name = "wrong-answer"

    def schedule(self, call):
        if call.claim():
            call.set_result(6)

    def shutdown(self, wait, cancel_futures):
        pass
'''

_AUTHORS_TEST = '''
from offload.testing import StrategyContract


class TestWrongAnswer(StrategyContract):
    strategy_name = "wrong-answer"
'''


def test_an_outside_authors_run_shows_values_and_leaves_the_folder_clean(tmp_path: Path) -> None:
    """The suite as an outside author runs it (a plugin registered by its
    entry point, pytest started in the plugin's folder with no configuration
    of its own): a failing assertion of the suite shows its values, without
    the author registering assert rewriting, and neither Hypothesis nor
    pytest-benchmark leaves a folder behind there."""
    dist = tmp_path / "wrong_answer-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: wrong-answer\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[offload.strategies]\nwrong-answer = wrong_answer:WrongAnswer\n")
    (tmp_path / "wrong_answer.py").write_text(_WRONG_STRATEGY)
    (tmp_path / "test_wrong.py").write_text(_AUTHORS_TEST)
    env = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_STORAGE_DIRECTORY"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(offload.__file__).parents[1]), str(tmp_path)])
    selected = "asyncio and (test_run_returns_result or test_same_result_as_a_direct_call)"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", selected],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "2 failed" in out, out
    assert "assert 6 == 5" in out, out  # the values, as pytest shows them
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))
    assert left == [], out
