"""Admission (`max_queue` → `Overloaded`), deadlines, metrics and graceful shutdown:
what is not in the contract suite (`offload.testing`, run for every strategy)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

import offload
from offload import _metrics
from offload._call import Call

from . import faults, helpers
from .helpers import TIMEOUT

pytestmark = pytest.mark.anyio

prometheus_client = pytest.importorskip("prometheus_client")
REGISTRY = prometheus_client.REGISTRY


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_inline_refuses_max_queue() -> None:
    with pytest.raises(offload.ConfigError, match="no option .max_queue."):
        offload.get_executor("inline", max_queue=1)  # type: ignore[call-arg]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_bad_max_queue_is_a_config_error(bad: object) -> None:
    with pytest.raises(offload.ConfigError, match="max_queue"):
        offload.get_executor("thread", max_queue=bad)


def test_make_async_rejects_bad_timeout() -> None:
    with pytest.raises(offload.ConfigError, match="timeout"):
        offload.make_async(helpers.add, strategy="thread", timeout=0)


def test_worker_skips_a_call_whose_deadline_passed() -> None:
    woke: list[bool] = []
    call: Call[int] = Call(helpers.add, (1,), {})
    call.deadline = time.perf_counter() - 1
    call.on_done = lambda: woke.append(True)
    assert not call.claim()
    assert call.done
    assert woke == [True]
    assert isinstance(call.error, TimeoutError)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_process_crash_counts_a_crashed_call_and_a_restart(tmp_path: Path) -> None:
    ex = offload.get_executor("process", max_workers=1)
    crashed_before = sample("offload_crashed_calls_total", strategy="process", function="tests.helpers.kill_self")
    restarts_before = sample("offload_worker_restarts_total", strategy="process", reason="crashed")
    try:
        with pytest.raises(offload.WorkerCrashed):
            await ex.run(helpers.kill_self, str(tmp_path))
        assert await ex.run(helpers.add, 1, b=1) == 2
    finally:
        await ex.aclose()
    assert sample("offload_crashed_calls_total", strategy="process", function="tests.helpers.kill_self") == crashed_before + 1
    assert sample("offload_worker_restarts_total", strategy="process", reason="crashed") == restarts_before + 1


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_async_renderer_observes_batch_sizes(tmp_path: Path) -> None:
    ex = offload.get_executor("async-renderer", max_batch_size=8)
    gate = str(tmp_path / "gate")

    def double_all(items: list[int]) -> list[int]:
        return [2 * i for i in items]

    def double(i: int) -> int:
        return 2 * i

    batched = offload.make_async(double, executor=ex, batch=double_all)
    labels = {"strategy": "async-renderer", "function": f"{__name__}.{double.__qualname__}"}
    before = sample("offload_batch_size_sum", **labels)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ex.run, faults.gated, gate, str(tmp_path), "hold")
            await helpers.wait_until(lambda: ex.in_flight == 1)
            for i in range(8):
                tg.start_soon(batched, i)
            await helpers.wait_until(lambda: ex.in_flight == 9)
            await anyio.Path(gate).touch()
    finally:
        await ex.aclose()
    assert sample("offload_batch_size_sum", **labels) == before + 8


async def test_sample_loop_lag_sees_a_blocked_loop() -> None:
    name = f"test-{os.getpid()}-{time.perf_counter_ns()}"
    async with anyio.create_task_group() as tg:
        tg.start_soon(offload.sample_loop_lag, name, 0.005)
        await anyio.sleep(0.05)
        time.sleep(0.1)  # noqa: ASYNC251 (block the loop, as a stray blocking call would)
        await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    assert sample("offload_loop_lag_seconds_count", loop=name) >= 3
    assert sample("offload_loop_lag_seconds_sum", loop=name) >= 0.09
    assert sample("offload_loop_lag_seconds_bucket", loop=name, le="0.05") < sample(
        "offload_loop_lag_seconds_count", loop=name
    )


def test_core_works_without_prometheus_client() -> None:
    code = """
import sys
sys.modules["prometheus_client"] = None  # as if not installed
import anyio, offload
from offload._metrics import metrics_enabled
assert not metrics_enabled()

async def main():
    ex = offload.get_executor("thread", max_workers=1, max_queue=0)
    assert await ex.run(sum, [1, 2]) == 3
    await offload.sample_loop_lag()  # returns at once when metrics are off
    await ex.aclose()
    print("ok")

anyio.run(main)
"""
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_offload_metrics_0_turns_them_off() -> None:
    code = "import offload._metrics as m; print(m.metrics_enabled())"
    env = {**os.environ, "OFFLOAD_METRICS": "0"}
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env, timeout=120)
    assert result.stdout.strip() == "False", result.stderr


# ---- graceful shutdown --------------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_aclose_timeout_kills_process_workers_still_running(tmp_path: Path) -> None:
    import psutil

    ex = offload.get_executor("process", max_workers=2)
    outcomes: list[Any] = []

    async def one() -> None:
        try:
            outcomes.append(await ex.run(helpers.write_pid_and_sleep, str(tmp_path), 60))
        except Exception as exc:
            outcomes.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(2):
            tg.start_soon(one)
        # Both calls running in their workers (each announces its pid), not
        # only both workers started: on a loaded machine the second call was
        # still on its way when `aclose` came, and was closed, not killed.
        await helpers.wait_until(lambda: len(list(tmp_path.iterdir())) == 2)
        pids = ex.strategy.worker_pids()
        started = time.perf_counter()
        await ex.aclose(timeout=0.5)
        took = time.perf_counter() - started
    assert len(outcomes) == 2
    assert all(isinstance(o, offload.WorkerCrashed) for o in outcomes), outcomes
    assert took < 30  # far below the calls' 60 s
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


async def test_kills_offload_orders_are_counted_as_stopped_calls_not_crashes(tmp_path: Path) -> None:
    ex = offload.get_executor("process", max_workers=1, cancel="kill")
    fn = _metrics.function_label(helpers.sleep_and_return)
    crashed = sample("offload_crashed_calls_total", strategy="process", function=fn)
    dropped = {
        reason: sample("offload_dropped_calls_total", strategy="process", function=fn, reason=reason)
        for reason in ("deadline", "cancelled", "shutdown")
    }
    restarts = {
        reason: sample("offload_worker_restarts_total", strategy="process", reason=reason)
        for reason in ("crashed", "killed")
    }
    try:
        await ex.run(helpers.pid)  # a worker up
        with pytest.raises(TimeoutError):
            await ex.run_with_timeout(0.5, helpers.sleep_and_return, 60)
        with anyio.move_on_after(0.5):
            await ex.run(helpers.sleep_and_return, 60)
        await helpers.wait_until(
            lambda: sample("offload_worker_restarts_total", strategy="process", reason="killed")
            == restarts["killed"] + 2
        )
        pending = ex.submit(helpers.sleep_and_return, 60)
        await helpers.wait_until(lambda: ex.in_flight == 1)
        # Claimed by its slot (a busy machine can take a while to restart the
        # killed worker), then sent to the worker.
        await helpers.wait_until(pending.running)
        await anyio.sleep(0.2)
    finally:
        await ex.aclose(timeout=0.2)
    with pytest.raises(offload.WorkerCrashed):
        pending.result(TIMEOUT)
    assert sample("offload_crashed_calls_total", strategy="process", function=fn) == crashed
    assert sample("offload_worker_restarts_total", strategy="process", reason="crashed") == restarts["crashed"]
    for reason in ("deadline", "cancelled", "shutdown"):
        assert sample(
            "offload_dropped_calls_total", strategy="process", function=fn, reason=reason
        ) == dropped[reason] + 1, reason
