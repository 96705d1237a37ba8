"""The contract suite's tests of cancellation, the concurrency bound and lanes (part of `StrategyContract`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

import offload

from . import _functions as f
from ._contract_base import (
    _ContractBase,
    _inflight,
    _markers,
    _order,
    _peak_concurrency,
    _wait_until,
)


class QueueContract(_ContractBase):
    """The contract: cancellation, the concurrency bound and lanes."""

    # ---- cancellation ----------------------------------------------------------------

    async def test_cancelled_call_that_has_not_started_never_runs(self, strategy: str, tmp_path: Path) -> None:
        ex = self.new_executor(strategy, max_workers=1)
        try:
            capacity = self._needs_queue(ex)
            blockers = [tmp_path / f"blocker{i}" for i in range(capacity)]
            queued = tmp_path / "queued"
            async with anyio.create_task_group() as tg:
                for blocker in blockers:
                    tg.start_soon(ex.run, f.write_marker, str(blocker), 0.5)
                await anyio.sleep(0.1)
                with anyio.CancelScope() as scope:
                    scope.cancel()
                    await ex.run(f.write_marker, str(queued))
            await anyio.sleep(0.3)
            assert [_markers(b) for b in blockers] == [1] * capacity
            assert _markers(queued) == 0
            assert await ex.run(f.add, 1, 2) == 3
        finally:
            await ex.aclose()

    async def test_cancelling_a_running_call_returns_at_once_and_it_finishes(
        self, strategy: str, tmp_path: Path
    ) -> None:
        ex = self.new_executor(strategy)
        try:
            await self._skip_if_on_callers_thread(ex)  # also brings a worker up
            marker = tmp_path / "m"
            with anyio.move_on_after(0.3) as scope:
                await ex.run(f.write_marker, str(marker), 1.0)
            assert scope.cancelled_caught
            assert _markers(marker) == 0  # returned before the call finished
            with anyio.fail_after(30):
                while _markers(marker) == 0:  # noqa: ASYNC110 (a file another process writes)
                    await anyio.sleep(0.05)
        finally:
            await ex.aclose()

    async def test_queued_calls_cancelled_concurrently_never_run(self, strategy: str, tmp_path: Path) -> None:
        ex = self.new_executor(strategy, max_workers=1)
        try:
            capacity = self._needs_queue(ex)
            mask = [i % 3 != 1 for i in range(8)]
            async with anyio.create_task_group() as tg:
                for _ in range(capacity):
                    tg.start_soon(ex.run, f.sleep_and_return, 0.2)
                await anyio.sleep(0.05)
                scopes = []
                for i, cancel in enumerate(mask):
                    scope = anyio.CancelScope()
                    scopes.append((scope, cancel))

                    async def one(i: int = i, scope: anyio.CancelScope = scope) -> None:
                        with scope:
                            await ex.run(f.write_marker, str(tmp_path / f"{i}"))

                    tg.start_soon(one)
                await anyio.lowlevel.checkpoint()
                for scope, cancel in scopes:
                    if cancel:
                        scope.cancel()
        finally:
            await ex.aclose()
        ran = {int(p.name) for p in tmp_path.iterdir()}  # noqa: ASYNC240 (the calls are over)
        assert ran == {i for i, cancel in enumerate(mask) if not cancel}

    # ---- the concurrency bound and lanes ---------------------------------------------

    async def test_concurrency_bound_holds(self, strategy: str, tmp_path: Path) -> None:
        ex = self.new_executor(strategy)
        try:
            capacity = self._needs_queue(ex)
            peak = await _peak_concurrency(ex, tmp_path, calls=12, hold=0.05)
        finally:
            await ex.aclose()
        assert 1 <= peak <= capacity

    async def _occupy(self, ex: offload.Executor, tg: Any, tmp_path: Path) -> Path:
        """Start calls that hold every worker until the returned gate file exists."""
        gate = tmp_path / "gate"
        started = [tmp_path / f"started{i}" for i in range(ex.capacity or 1)]
        for path in started:
            tg.start_soon(ex.run, f.hold_until, str(gate), str(path))
        await _wait_until(lambda: all(p.exists() for p in started), 60)
        return gate

    async def test_lanes_share_the_workers_by_weight(self, strategy: str, tmp_path: Path) -> None:
        ex = self.new_executor(strategy, max_workers=1, lanes={"query": 3, "ingest": 1})
        log = tmp_path / "order"
        try:
            capacity = self._needs_queue(ex)
            async with anyio.create_task_group() as tg:
                gate = await self._occupy(ex, tg, tmp_path)
                query, ingest = ex.options(lane="query"), ex.options(lane="ingest")
                for i in range(24):
                    tg.start_soon(ingest.run, f.record, str(log), 100 + i)
                    tg.start_soon(query.run, f.record, str(log), i)
                await _wait_until(lambda: _inflight(ex) == capacity + 48)
                gate.touch()
            first = _order(log)[:16]
            assert 10 <= sum(1 for i in first if i < 100) <= 14, first  # 3/4 of 16
        finally:
            await ex.aclose()

    async def test_the_default_lanes_weight_holds_for_calls_that_name_no_lane(
        self, strategy: str, tmp_path: Path
    ) -> None:
        ex = self.new_executor(strategy, max_workers=1, lanes={"default": 4, "bulk": 1})
        log = tmp_path / "order"
        try:
            capacity = self._needs_queue(ex)
            async with anyio.create_task_group() as tg:
                gate = await self._occupy(ex, tg, tmp_path)
                bulk = ex.options(lane="bulk")
                for i in range(25):
                    tg.start_soon(bulk.run, f.record, str(log), 100 + i)
                    tg.start_soon(ex.run, f.record, str(log), i)  # no lane: the default one
                await _wait_until(lambda: _inflight(ex) == capacity + 50)
                gate.touch()
            first = _order(log)[:20]
            # 4/5 of 20 is 16; weight 1 (the default lane's weight ignored) gives 10.
            assert 14 <= sum(1 for i in first if i < 100) <= 18, first
        finally:
            await ex.aclose()
