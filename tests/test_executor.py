"""Executor semantics beyond the contract suite (`offload.testing`, run for every
strategy by tests/test_contract.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import offload

from . import helpers

pytestmark = pytest.mark.anyio


def _markers(path: Path) -> int:
    return path.read_text().count("ran") if path.exists() else 0


async def test_worker_state_outside_a_worker_is_an_error() -> None:
    with pytest.raises(offload.OffloadError, match="worker_state"):
        offload.worker_state()


def test_submit_future_cancelled_before_start_never_runs(tmp_path: Path) -> None:
    ex = offload.get_executor("thread", max_workers=1)
    try:
        blocker = ex.submit(helpers.sleep_and_return, 0.3)
        queued = ex.submit(helpers.write_marker, str(tmp_path / "q"))
        assert queued.cancel()
        assert blocker.result(timeout=30) is None
        assert _markers(tmp_path / "q") == 0
    finally:
        ex.shutdown()


async def test_deep_traceback_keeps_the_exception_type(executor: offload.Executor) -> None:
    with pytest.raises(ValueError, match="bottom of 0"):
        await executor.run(helpers.recurse_then_raise, 700)
    with pytest.raises(RecursionError):
        await executor.run(helpers.recurse_forever)
