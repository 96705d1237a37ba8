"""The contract suite's tests of admission (`max_queue`, `admission()`), deadlines and metrics (part of `StrategyContract`)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

import offload

from . import _functions as f
from ._contract_base import (
    _ContractBase,
    _inflight,
    _overloaded,
    _sample,
    _wait_until,
)


class AdmissionContract(_ContractBase):
    """The contract: admission (`max_queue`, `admission()`), deadlines and metrics."""

    # ---- admission: max_queue --------------------------------------------------------

    async def test_max_queue_refuses_excess_at_once_and_runs_nothing_for_it(
        self, strategy: str, tmp_path: Path
    ) -> None:
        max_queue = 3
        ex = self.new_executor(strategy, max_queue=max_queue) if self._queues(strategy) else None
        if ex is None:
            pytest.skip(f"{strategy} has no queue (capacity() is None): max_queue does not apply")
        capacity = self._needs_queue(ex)
        assert ex.max_queue == max_queue
        gate = str(tmp_path / "gate")
        labels = {"strategy": strategy, "function": f"{f.__name__}.gated", "reason": "overloaded"}
        rejected_before = _sample("offload_rejected_calls_total", **labels)
        results: list[str] = []
        try:
            async with anyio.create_task_group() as tg:

                async def one(tag: str) -> None:
                    results.append(await ex.run(f.gated, gate, str(tmp_path), tag))

                for i in range(capacity + max_queue):
                    tg.start_soon(one, f"ok{i}")
                await _wait_until(lambda: ex.overloaded)
                assert _inflight(ex) == capacity + max_queue
                with pytest.raises(offload.Overloaded, match="max_queue=3"):
                    await ex.run(f.gated, gate, str(tmp_path), "refused")
                with pytest.raises(offload.Overloaded):
                    ex.submit(f.gated, gate, str(tmp_path), "refused-too")
                await anyio.Path(gate).touch()
            assert sorted(results) == sorted(f"ok{i}" for i in range(capacity + max_queue))
            assert not (tmp_path / "refused").exists()
            assert not (tmp_path / "refused-too").exists()
            assert await ex.run(f.add, 1, b=2) == 3  # the queue drained: admitted again
            assert _inflight(ex) == 0
            if rejected_before is not None:
                assert _sample("offload_rejected_calls_total", **labels) == rejected_before + 2
        finally:
            await anyio.Path(gate).touch()
            await ex.aclose()

    async def test_cancelled_queued_calls_free_their_place(self, strategy: str, tmp_path: Path) -> None:
        if not self._queues(strategy):
            pytest.skip(f"{strategy} has no queue (capacity() is None): max_queue does not apply")
        ex = self.new_executor(strategy, max_queue=2)
        capacity = self._needs_queue(ex)
        gate = str(tmp_path / "gate")
        try:
            async with anyio.create_task_group() as tg:
                for i in range(capacity + 2):
                    tg.start_soon(ex.run, f.gated, gate, str(tmp_path), f"a{i}")
                await _wait_until(lambda: _inflight(ex) == capacity + 2)
                with pytest.raises(offload.Overloaded):
                    await ex.run(f.add, 1)
                tg.cancel_scope.cancel()
            # The running calls still hold their workers; the queued ones left.
            assert _inflight(ex) <= capacity
            await anyio.Path(gate).touch()
            await _wait_until(lambda: _inflight(ex) == 0)
            assert await ex.run(f.add, 2, b=2) == 4
        finally:
            await anyio.Path(gate).touch()
            await ex.aclose()

    async def test_admission_refuses_a_request_early_and_never_halfway(
        self, strategy: str, tmp_path: Path
    ) -> None:
        if not self._queues(strategy):
            pytest.skip(f"{strategy} has no queue (capacity() is None): max_queue does not apply")
        ex = self.new_executor(strategy, max_queue=0)
        capacity = self._needs_queue(ex)
        gate = str(tmp_path / "gate")
        label = "offload.testing.request"
        labels = {"strategy": strategy, "function": label, "reason": "overloaded"}
        refused_before = _sample("offload_rejected_calls_total", **labels)
        try:
            assert not _overloaded(ex)
            async with anyio.create_task_group() as tg:
                with ex.admission(label):
                    # One admitted request (holding one place) may put more calls in flight than the bound.
                    for i in range(capacity + 3):
                        tg.start_soon(ex.run, f.gated, gate, str(tmp_path), f"part{i}")
                    await _wait_until(lambda: _inflight(ex) == capacity + 4)
                assert _inflight(ex) == capacity + 3  # the place was given back
                assert _overloaded(ex)
                with pytest.raises(offload.Overloaded), ex.admission(label):
                    pass  # a full executor refuses the request before it starts
                with pytest.raises(offload.Overloaded):
                    await ex.run(f.add, 1)  # outside any admitted request
                await anyio.Path(gate).touch()
            assert sorted(os.listdir(tmp_path)) == sorted(["gate", *(f"part{i}" for i in range(capacity + 3))])
            if refused_before is not None:
                assert _sample("offload_rejected_calls_total", **labels) == refused_before + 1
            assert not _overloaded(ex)
        finally:
            await anyio.Path(gate).touch()
            await ex.aclose()

    def test_admitted_requests_hold_a_place_until_released(self, strategy: str) -> None:
        if not self._queues(strategy):
            pytest.skip(f"{strategy} has no queue (capacity() is None): max_queue does not apply")
        ex = self.new_executor(strategy, max_queue=1)
        capacity = self._needs_queue(ex)
        try:
            with contextlib.ExitStack() as stack:
                # A burst: capacity + max_queue requests admitted before any made a call.
                places = [stack.enter_context(ex.admission("burst")) for _ in range(capacity + 1)]
                with pytest.raises(offload.Overloaded), ex.admission("burst"):
                    pass
                places[0].release()
                places[0].release()  # idempotent
                with ex.admission("burst"):
                    pass
            assert _inflight(ex) == 0
        finally:
            ex.shutdown()

    async def test_admission_keeping_its_cost_holds_it_until_it_ends(self, strategy: str) -> None:
        if not self._queues(strategy):
            pytest.skip(f"{strategy} has no queue (capacity() is None): max_queued_cost does not apply")
        ex = self.new_executor(strategy, max_queued_cost=100)
        try:
            with ex.admission("kept", cost=60, keep_cost=True):
                assert ex.queued_cost == 60
                # A call paid out of the kept cost leaves it counted once it ran.
                assert await ex.options(cost=40).run(f.add, 1, b=2) == 3
                assert ex.queued_cost == 60
                # Beyond the kept cost, a call adds its excess while it waits, and takes it away once it ran.
                assert await ex.options(cost=90).run(f.add, 2, b=2) == 4
                assert ex.queued_cost == 60
                with pytest.raises(offload.Overloaded), ex.admission("second", cost=50):
                    pass
            assert ex.queued_cost == 0
            with ex.admission("second", cost=50):
                pass
            assert _inflight(ex) == 0
        finally:
            await ex.aclose()

    # ---- deadlines -------------------------------------------------------------------

    async def test_deadline_drops_a_queued_call_before_it_runs(self, strategy: str, tmp_path: Path) -> None:
        ex = self.new_executor(strategy)
        gate = str(tmp_path / "gate")
        labels = {"strategy": strategy, "function": f"{f.__name__}.gated", "reason": "deadline"}
        dropped_before = _sample("offload_dropped_calls_total", **labels)
        try:
            capacity = self._needs_queue(ex)
            async with anyio.create_task_group() as tg:
                for i in range(capacity):
                    tg.start_soon(ex.run, f.gated, gate, str(tmp_path), f"busy{i}")
                await _wait_until(lambda: _inflight(ex) == capacity)
                started = time.perf_counter()
                with pytest.raises(TimeoutError, match="timeout of 0.2s"):
                    await ex.run_with_timeout(0.2, f.gated, gate, str(tmp_path), "late")
                waited = time.perf_counter() - started
                await anyio.Path(gate).touch()
            await _wait_until(lambda: _inflight(ex) == 0)
            assert not (tmp_path / "late").exists()
            assert waited < 10  # it did not wait for the gate (30 s)
            if dropped_before is not None:
                assert _sample("offload_dropped_calls_total", **labels) == dropped_before + 1
        finally:
            await anyio.Path(gate).touch()
            await ex.aclose()

    async def test_run_with_timeout_returns_in_time_and_keeps_fn_keywords(
        self, executor: offload.Executor
    ) -> None:
        assert await executor.run_with_timeout(30, f.echo_args, 1, timeout=5) == ((1,), {"timeout": 5})
        assert await executor.run_with_timeout(None, f.add, 1, b=1) == 2

    async def test_make_async_timeout(self, strategy: str) -> None:
        ex = self.new_executor(strategy)
        try:
            await self._skip_if_on_callers_thread(ex)
            slow = offload.make_async(f.sleep_and_return, executor=ex, timeout=0.2)
            with pytest.raises(TimeoutError):
                await slow(1, "never")
            fast = offload.make_async(f.add, executor=ex, timeout=30)
            assert await fast(20, b=22) == 42
        finally:
            ex.shutdown(wait=False, cancel_futures=True)

    # ---- metrics ---------------------------------------------------------------------

    async def test_metrics_count_calls_and_return_gauges_to_zero(self, strategy: str) -> None:
        labels = {"strategy": strategy, "function": f"{f.__name__}.add"}
        runs_before = _sample("offload_run_seconds_count", **labels)
        if runs_before is None:
            pytest.skip("metrics are off (prometheus_client is not installed)")
        waits_before = _sample("offload_queue_wait_seconds_count", **labels)
        ex = self.new_executor(strategy)
        try:
            async with anyio.create_task_group() as tg:
                for i in range(20):
                    tg.start_soon(ex.run, f.add, i)
        finally:
            await ex.aclose()
        assert _sample("offload_run_seconds_count", **labels) == runs_before + 20
        assert _sample("offload_queue_wait_seconds_count", **labels) == (waits_before or 0) + 20
        assert _sample("offload_queued_calls", **labels) == 0
        assert _sample("offload_running_calls", **labels) == 0
        with pytest.raises(offload.ExecutorClosed):
            await ex.run(f.add, 1)
        assert (_sample("offload_rejected_calls_total", **labels, reason="closed") or 0) >= 1
