"""The contract suite's tests of `start()`, shutdown, fork and crashed workers (part of `StrategyContract`)."""

from __future__ import annotations

import concurrent.futures
import functools
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import offload

from . import _functions as f
from ._contract_base import (
    _ContractBase,
    _inflight,
    _markers,
    _sample,
    _wait_until,
)


class LifecycleContract(_ContractBase):
    """The contract: `start()`, shutdown, fork and crashed workers."""

    # ---- start -----------------------------------------------------------------------

    @staticmethod
    def _init_runs(directory: Path) -> tuple[list[str], int]:
        files = sorted(directory.iterdir())
        return [p.name for p in files], sum(len(p.read_text().splitlines()) for p in files)

    @staticmethod
    def _starts_workers(ex: offload.Executor) -> bool:
        return type(ex.strategy).start is not offload.strategy.Strategy.start

    async def test_start_warms_every_worker_before_the_first_call(self, strategy: str, tmp_path: Path) -> None:
        ex = self.new_executor(strategy, initializer=f.count_init, initargs=(str(tmp_path),))
        try:
            await anyio.to_thread.run_sync(ex.start)
            if not self._starts_workers(ex):
                assert self._init_runs(tmp_path) == ([], 0)  # nothing to start, nothing ran
                return
            started, runs = self._init_runs(tmp_path)
            workers = getattr(ex.strategy, "max_workers", None)
            if isinstance(workers, int) and getattr(ex.strategy, "express_cost", 0) > 0:
                workers += 1  # the express worker starts too
            assert runs == workers if isinstance(workers, int) else runs >= 1
            await anyio.to_thread.run_sync(ex.start)  # idempotent
            for _ in range(20):
                await ex.run(f.add, 1, 1)
            # The calls ran on the workers start() made: no worker was started for them.
            assert self._init_runs(tmp_path) == (started, runs)
        finally:
            await ex.aclose()
        with pytest.raises(offload.ExecutorClosed):
            ex.start()

    async def test_start_reports_a_failing_initializer(self, strategy: str) -> None:
        before = set(threading.enumerate())
        ex = self.new_executor(strategy, initializer=f.fail_init)
        try:
            if not self._starts_workers(ex):
                ex.start()  # nothing to start: the failure shows at the first call
                return
            with pytest.raises(offload.OffloadError) as info:
                await anyio.to_thread.run_sync(ex.start)
            assert "initializer broke" in repr(info.value) + repr(info.value.__cause__)
            # Calls fail the same way, and end.
            with anyio.fail_after(60), pytest.raises(offload.OffloadError):
                await ex.run(f.add, 1, 1)
        finally:
            with anyio.fail_after(60):
                await ex.aclose()
        # What the failed starts left is released (`SlotWorker.stop_worker`).
        assert self._threads_left(before) == []

    # ---- shutdown --------------------------------------------------------------------

    async def test_closed_executor_refuses_calls(self, strategy: str) -> None:
        ex = self.new_executor(strategy)
        assert await ex.run(f.add, 1) == 1
        await ex.aclose()
        assert ex.closed
        with pytest.raises(offload.ExecutorClosed):
            await ex.run(f.add, 1)
        with pytest.raises(offload.ExecutorClosed):
            ex.submit(f.add, 1)
        ex.shutdown()  # idempotent

    async def test_context_managers(self, strategy: str) -> None:
        async with self.new_executor(strategy) as ex:
            assert await ex.run(f.add, 1, 1) == 2
        assert ex.closed
        with self.new_executor(strategy) as ex2:
            assert ex2.submit(f.add, 2, 2).result(timeout=30) == 4
        assert ex2.closed

    async def test_shutdown_leaves_no_threads_behind(self, strategy: str) -> None:
        before = set(threading.enumerate())
        ex = self.new_executor(strategy)
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(ex.run, f.sleep_and_return, 0.01)
        await ex.aclose()
        assert self._threads_left(before) == []

    @staticmethod
    def _threads_left(before: set[threading.Thread]) -> list[str]:
        # anyio's own to_thread worker (used by aclose) is idle and may linger: it is not ours.
        return sorted(t.name for t in set(threading.enumerate()) - before if t.name.startswith("offload"))

    def test_shutdown_without_waiting_still_lets_every_worker_exit(self, strategy: str, tmp_path: Path) -> None:
        """`shutdown(wait=False)` returns while calls still run; the calls
        finish, and then every worker exits with no one waiting for it: what
        the slots share is released by them (`SlotWorker.stop_worker`)."""
        before = set(threading.enumerate())
        ex = self.new_executor(strategy)
        gate, started = tmp_path / "gate", tmp_path / "started"
        running: list[concurrent.futures.Future[str]] = []
        # Submitted from a thread of its own: where the call runs on the caller's
        # thread (`inline`), `submit` returns only once the call has ended, and the
        # gate, opened after it, would never be what ends the call.
        submitter = threading.Thread(target=lambda: running.append(ex.submit(f.hold_until, str(gate), str(started))))
        submitter.start()
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        ex.shutdown(wait=False)
        gate.touch()
        submitter.join(60)
        assert running[0].result(timeout=60) == "held"
        deadline = time.monotonic() + 30
        while self._threads_left(before) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self._threads_left(before) == []

    def test_shutdown_cancel_futures_drops_queued_calls(self, strategy: str, tmp_path: Path) -> None:
        ex = self.new_executor(strategy, max_workers=1)
        try:
            capacity = self._needs_queue(ex)
            gate = tmp_path / "gate"
            started = [tmp_path / f"started{i}" for i in range(capacity)]
            running = [ex.submit(f.hold_until, str(gate), str(p)) for p in started]
            deadline = time.monotonic() + 60
            while not all(p.exists() for p in started) and time.monotonic() < deadline:
                time.sleep(0.005)
            queued = [ex.submit(f.write_marker, str(tmp_path / "q")) for _ in range(5)]
            opener = threading.Timer(0.2, gate.touch)
            opener.start()
            ex.shutdown(wait=True, cancel_futures=True)
            opener.join()
            assert [r.result(timeout=0) for r in running] == ["held"] * capacity
            assert [q.cancelled() for q in queued] == [True] * len(queued)
            assert _markers(tmp_path / "q") == 0
            with pytest.raises(concurrent.futures.CancelledError):
                queued[0].result(timeout=0)
        finally:
            ex.shutdown()

    async def test_aclose_timeout_fails_queued_calls_and_lets_running_ones_finish(
        self, strategy: str, tmp_path: Path
    ) -> None:
        if not self._queues(strategy):
            pytest.skip(f"{strategy} has no queue and nothing running off the loop")
        ex = self.new_executor(strategy, max_queue=50)
        capacity = self._needs_queue(ex)
        # Workers up first (they may take seconds to start), so the calls below
        # are running, not queued, when the shutdown begins.
        await anyio.to_thread.run_sync(ex.start)
        outcomes: dict[str, Any] = {}

        async def one(tag: str, call: Callable[..., int], *args: Any) -> None:
            try:
                outcomes[tag] = await ex.run(call, *args)
            except Exception as exc:
                outcomes[tag] = exc

        started = [tmp_path / f"started{i}" for i in range(capacity)]
        release = tmp_path / "release"
        queued = [f"queued{i}" for i in range(5)]
        async with anyio.create_task_group() as tg:
            for i, marker in enumerate(started):
                tg.start_soon(one, f"running{i}", f.mark_then_square_once, str(marker), str(release), 3)
            # Running, not queued: each has left its marker (a fixed wait was
            # too short on a loaded machine).
            await _wait_until(lambda: all(marker.exists() for marker in started), 60)
            for tag in queued:
                tg.start_soon(one, tag, f.square_after, 0.0, 3)
            await _wait_until(lambda: _inflight(ex) == capacity + 5)
            # The running calls hold their workers until the queued ones have
            # their answer (a call that ended on its own could free a worker
            # for a queued call before `aclose` began, on a loaded machine).
            tg.start_soon(functools.partial(ex.aclose, timeout=30))
            await _wait_until(lambda: all(tag in outcomes for tag in queued), 30)
            release.touch()
        with pytest.raises(offload.ExecutorClosed):
            await ex.run(f.add, 1)
        for i in range(capacity):
            assert outcomes[f"running{i}"] == 9
        for i in range(5):
            assert isinstance(outcomes[f"queued{i}"], offload.ExecutorClosed), outcomes[f"queued{i}"]
            assert "shut down before this call started" in str(outcomes[f"queued{i}"])

    # ---- fork and crashes ------------------------------------------------------------

    def test_an_executor_used_before_fork_serves_the_child(self, strategy: str) -> None:
        """In a child made by `os.fork()`, a call on the parent's executor runs
        on the child's own workers, or fails with `OffloadError` (a strategy
        that cannot work in a forked child says so): it never hangs, and the
        parent's executor keeps working."""
        if not hasattr(os, "fork"):
            pytest.skip("no os.fork() on this platform")
        ex = self.new_executor(strategy)
        try:
            assert ex.submit(f.add, 1, 1).result(timeout=60) == 2
            with warnings.catch_warnings():
                # Python 3.12+ warns about forking a process with threads: this test does it on purpose.
                warnings.simplefilter("ignore", DeprecationWarning)
                child = os.fork()
            if child == 0:  # pragma: no cover (the child)
                code = 1
                try:
                    signal.alarm(45)  # a hung child dies, and the test fails, instead of hanging
                    code = 0 if ex.submit(f.add, 1, 2).result(timeout=30) == 3 else 1
                except offload.OffloadError:
                    code = 3
                except BaseException:
                    code = 2
                finally:
                    try:
                        # The workers the child started are the child's to stop
                        # (a ProcessPoolExecutor's outlive an owner that exits
                        # without shutting it down).
                        ex.shutdown()
                    except BaseException:
                        code = code or 4
                    os._exit(code)
            deadline = time.monotonic() + 60
            while not (status := os.waitpid(child, os.WNOHANG))[0]:
                if time.monotonic() > deadline:
                    os.kill(child, signal.SIGKILL)
                    status = os.waitpid(child, 0)
                    break
                time.sleep(0.05)
            assert os.waitstatus_to_exitcode(status[1]) in (0, 3)
            assert ex.submit(f.add, 5, 5).result(timeout=60) == 10
        finally:
            ex.shutdown()

    async def test_a_crashed_worker_fails_its_call_and_is_replaced(self, strategy: str) -> None:
        ex = self.new_executor(strategy, max_workers=1)
        try:
            if not type(ex.strategy).replaces_crashed_workers:
                pytest.skip(f"{strategy} does not replace crashed workers (replaces_crashed_workers = False)")
            restarts = {"strategy": strategy, "reason": "crashed"}
            restarts_before = _sample("offload_worker_restarts_total", **restarts)
            with pytest.raises(offload.WorkerCrashed):
                await ex.run(f.kill_self, os.getpid())
            assert await ex.run(f.add, 1, b=1) == 2
            if restarts_before is not None:
                await _wait_until(
                    lambda: _sample("offload_worker_restarts_total", **restarts) == restarts_before + 1
                )
        finally:
            await ex.aclose()

    async def test_a_crash_fails_the_calls_beside_it_only_where_declared(self, strategy: str, tmp_path: Path) -> None:
        """A worker killed while another call runs: that call finishes, or,
        where the strategy declares `crash_fails_running_calls` (one pool that
        breaks whole), may fail with `WorkerCrashed` instead; the next call runs."""
        ex = self.new_executor(strategy, max_workers=2)
        try:
            declared = type(ex.strategy)
            if not declared.replaces_crashed_workers:
                pytest.skip(f"{strategy} does not replace crashed workers (replaces_crashed_workers = False)")
            gate, started = tmp_path / "gate", tmp_path / "started"
            outcome: dict[str, Any] = {}

            async def beside() -> None:
                try:
                    outcome["beside"] = await ex.run(f.hold_until, str(gate), str(started))
                except Exception as exc:
                    outcome["beside"] = exc

            async with anyio.create_task_group() as tg:
                tg.start_soon(beside)
                await _wait_until(started.exists, 60)
                with pytest.raises(offload.WorkerCrashed):
                    await ex.run(f.kill_self, os.getpid())
                gate.touch()
            if declared.crash_fails_running_calls:
                # Failed with it, or (a pool that let it end) its result: nothing else.
                assert outcome["beside"] == "held" or isinstance(outcome["beside"], offload.WorkerCrashed)
            else:
                assert outcome["beside"] == "held"
            assert await ex.run(f.add, 1, b=1) == 2
        finally:
            await ex.aclose()
