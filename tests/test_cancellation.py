"""Cancellation before a call starts: a caller already cancelled never
starts its call, and a cancelled `run_in_executor` gives its queue place back
at once (cancellation of running calls: the contract suite, `offload.testing`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import anyio
import pytest

import offload

from . import faults, helpers
from .conftest import has_pool, small_options
from .helpers import TIMEOUT

pytestmark = pytest.mark.anyio


#: Before the fix, `fn` ran in 45 to 199 of 300 tries for thread and async-renderer.
TRIES = 300


async def test_already_cancelled_caller_never_starts_the_call(strategy: str, tmp_path: Path) -> None:
    marker = str(tmp_path / "ran")
    ex = offload.get_executor(strategy, **small_options(strategy))
    try:
        for _ in range(TRIES):
            with anyio.CancelScope() as scope:
                scope.cancel()
                await ex.run(helpers.mark, marker)
            assert scope.cancelled_caught
    finally:
        ex.shutdown(wait=True)
    assert not Path(marker).exists()  # noqa: ASYNC240 (after the executor is gone)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_already_cancelled_asyncio_task_never_starts_the_call(strategy: str, tmp_path: Path) -> None:
    import asyncio

    marker = str(tmp_path / "ran")
    ex = offload.get_executor(strategy, **small_options(strategy))

    async def cancelled_then_run() -> None:
        asyncio.current_task().cancel()  # type: ignore[union-attr]
        await ex.run(helpers.mark, marker)

    try:
        for _ in range(TRIES):
            with pytest.raises(asyncio.CancelledError):
                await asyncio.get_running_loop().create_task(cancelled_then_run())
    finally:
        ex.shutdown(wait=True)
    assert not Path(marker).exists()  # noqa: ASYNC240 (after the executor is gone)


@pytest.mark.parametrize("anyio_backend", [pytest.param(("asyncio", {}), id="asyncio")])
async def test_a_cancelled_run_in_executor_gives_its_place_back_at_once(strategy: str, tmp_path: Path) -> None:
    if strategy == "inline":
        pytest.skip("inline has no queue")
    options = small_options(strategy, max_queue=1)
    if has_pool(strategy):
        options["max_workers"] = 1
    else:
        options["max_batch_size"] = 1
    ex = offload.get_executor(strategy, **options)
    gate, started = tmp_path / "gate", tmp_path / "started"
    try:
        held = ex.submit(faults.hold_until, str(gate), str(started))
        await helpers.wait_until(started.exists)
        loop = asyncio.get_running_loop()
        waiting = asyncio.ensure_future(loop.run_in_executor(ex, helpers.add, 1, 2))
        await helpers.wait_until(lambda: ex.in_flight == 2)
        with pytest.raises(offload.Overloaded):
            ex.submit(helpers.add, 0, 0)  # full: one running, one queued
        waiting.cancel()
        await helpers.wait_until(lambda: ex.in_flight == 1)
        admitted = ex.submit(helpers.add, 2, 3)  # the cancelled one's place
        gate.touch()
        assert admitted.result(TIMEOUT) == 5
        assert held.result(TIMEOUT) == "held"
    finally:
        gate.touch()
        await ex.aclose()
