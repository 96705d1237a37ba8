"""Admission (`max_queue` → `Overloaded`), deadlines, metrics and graceful shutdown,
on every backend × strategy where they apply."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

import offload
from offload._call import DEADLINE, Call

from . import faults, helpers
from .conftest import small_options

pytestmark = pytest.mark.anyio

prometheus_client = pytest.importorskip("prometheus_client")
REGISTRY = prometheus_client.REGISTRY


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def queued_options(strategy: str, max_queue: int) -> tuple[dict[str, Any], int]:
    """Options for a small pool with `max_queue`, and how many calls it runs at once."""
    if strategy == "async-renderer":
        return {"max_batch_size": 1, "max_queue": max_queue}, 1
    options = small_options(strategy, max_queue=max_queue)
    return options, options["max_workers"]


async def wait_until(predicate: Any, seconds: float = 30.0) -> None:
    for _ in range(int(seconds / 0.005)):
        if predicate():
            return
        await anyio.sleep(0.005)
    raise AssertionError(f"still not true after {seconds} s")


def test_inline_refuses_max_queue() -> None:
    with pytest.raises(offload.ConfigError, match="no option .max_queue."):
        offload.get_executor("inline", max_queue=1)  # type: ignore[call-arg]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_bad_max_queue_is_a_config_error(bad: object) -> None:
    with pytest.raises(offload.ConfigError, match="max_queue"):
        offload.get_executor("thread", max_queue=bad)


async def test_max_queue_refuses_excess_at_once_and_runs_nothing_for_it(
    strategy: str, tmp_path: Path
) -> None:
    if strategy == "inline":
        pytest.skip("inline has no queue")
    max_queue = 3
    options, capacity = queued_options(strategy, max_queue)
    gate = str(tmp_path / "gate")
    ex = offload.get_executor(strategy, **options)
    assert ex.max_queue == max_queue
    rejected_before = sample(
        "offload_rejected_calls_total",
        strategy=strategy, function="tests.faults.gated", reason="overloaded",
    )
    results: list[str] = []
    try:
        async with anyio.create_task_group() as tg:

            async def one(tag: str) -> None:
                results.append(await ex.run(faults.gated, gate, str(tmp_path), tag))

            for i in range(capacity + max_queue):
                tg.start_soon(one, f"ok{i}")
            await wait_until(lambda: ex._tracker is not None and ex._tracker.inflight == capacity + max_queue)
            started = time.perf_counter()
            with pytest.raises(offload.Overloaded, match="max_queue=3"):
                await ex.run(faults.gated, gate, str(tmp_path), "refused")
            with pytest.raises(offload.Overloaded):
                ex.submit(faults.gated, gate, str(tmp_path), "refused-too")
            refused_in = time.perf_counter() - started
            await anyio.Path(gate).touch()
        assert sorted(results) == sorted(f"ok{i}" for i in range(capacity + max_queue))
        assert not (tmp_path / "refused").exists()
        assert not (tmp_path / "refused-too").exists()
        # The queue drained: new calls are admitted again.
        assert await ex.run(helpers.add, 1, b=2) == 3
        assert ex._tracker is not None
        assert ex._tracker.inflight == 0
        assert sample(
            "offload_rejected_calls_total",
            strategy=strategy, function="tests.faults.gated", reason="overloaded",
        ) == rejected_before + 2
        assert refused_in < 5  # at once, not after the gate's 30 s
    finally:
        await anyio.Path(gate).touch()
        await ex.aclose()


async def test_cancelled_queued_calls_free_their_place(strategy: str, tmp_path: Path) -> None:
    if strategy == "inline":
        pytest.skip("inline has no queue")
    options, capacity = queued_options(strategy, 2)
    gate = str(tmp_path / "gate")
    ex = offload.get_executor(strategy, **options)
    try:
        async with anyio.create_task_group() as tg:
            for i in range(capacity + 2):
                tg.start_soon(ex.run, faults.gated, gate, str(tmp_path), f"a{i}")
            await wait_until(lambda: ex._tracker is not None and ex._tracker.inflight == capacity + 2)
            with pytest.raises(offload.Overloaded):
                await ex.run(helpers.add, 1)
            tg.cancel_scope.cancel()
        # The running calls still hold their workers; the queued ones left (a call a
        # worker had not claimed yet when its caller was cancelled left too).
        assert ex._tracker is not None
        assert ex._tracker.inflight <= capacity
        await anyio.Path(gate).touch()
        await wait_until(lambda: ex._tracker is not None and ex._tracker.inflight == 0)
        assert await ex.run(helpers.add, 2, b=2) == 4
    finally:
        await anyio.Path(gate).touch()
        await ex.aclose()


async def test_deadline_drops_a_queued_call_before_it_runs(strategy: str, tmp_path: Path) -> None:
    if strategy == "inline":
        pytest.skip("inline has no queue: a call starts at once")
    options, capacity = queued_options(strategy, 10)
    gate = str(tmp_path / "gate")
    ex = offload.get_executor(strategy, **options)
    dropped_before = sample(
        "offload_dropped_calls_total", strategy=strategy, function="tests.faults.gated", reason=DEADLINE
    )
    try:
        async with anyio.create_task_group() as tg:
            for i in range(capacity):
                tg.start_soon(ex.run, faults.gated, gate, str(tmp_path), f"busy{i}")
            await wait_until(lambda: ex._tracker is not None and ex._tracker.inflight == capacity)
            started = time.perf_counter()
            with pytest.raises(TimeoutError, match="timeout of 0.2s"):
                await ex.run_with_timeout(0.2, faults.gated, gate, str(tmp_path), "late")
            waited = time.perf_counter() - started
            await anyio.Path(gate).touch()
        await wait_until(lambda: ex._tracker is not None and ex._tracker.inflight == 0)
        assert not (tmp_path / "late").exists()
        assert waited < 10  # it did not wait for the gate (30 s)
        assert sample(
            "offload_dropped_calls_total", strategy=strategy, function="tests.faults.gated", reason=DEADLINE
        ) == dropped_before + 1
    finally:
        await anyio.Path(gate).touch()
        await ex.aclose()


async def test_run_with_timeout_returns_in_time_and_keeps_fn_keywords(executor: offload.Executor) -> None:
    assert await executor.run_with_timeout(30, helpers.echo_args, 1, timeout=5) == ((1,), {"timeout": 5})
    assert await executor.run_with_timeout(None, helpers.add, 1, b=1) == 2


async def test_make_async_timeout(strategy: str, tmp_path: Path) -> None:
    if strategy == "inline":
        pytest.skip("inline runs the call on the loop: nothing can time it out")
    ex = offload.get_executor(strategy, **small_options(strategy))
    try:
        slow = offload.make_async(helpers.sleep_and_return, executor=ex, timeout=0.2)
        with pytest.raises(TimeoutError):
            await slow(5, "never")
        fast = offload.make_async(helpers.add, executor=ex, timeout=30)
        assert await fast(20, b=22) == 42
    finally:
        ex.shutdown(wait=False, cancel_futures=True)


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


async def test_metrics_count_calls_and_return_gauges_to_zero(strategy: str) -> None:
    ex = offload.get_executor(strategy, **small_options(strategy))
    labels = {"strategy": strategy, "function": "tests.helpers.add"}
    runs_before = sample("offload_run_seconds_count", **labels)
    waits_before = sample("offload_queue_wait_seconds_count", **labels)
    try:
        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(ex.run, helpers.add, i)
    finally:
        await ex.aclose()
    assert sample("offload_run_seconds_count", **labels) == runs_before + 20
    assert sample("offload_queue_wait_seconds_count", **labels) == waits_before + 20
    assert sample("offload_queued_calls", **labels) == 0
    assert sample("offload_running_calls", **labels) == 0
    with pytest.raises(offload.ExecutorClosed):
        await ex.run(helpers.add, 1)
    assert sample("offload_rejected_calls_total", **labels, reason="closed") >= 1


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
            await wait_until(lambda: ex._tracker is not None and ex._tracker.inflight == 1)
            for i in range(8):
                tg.start_soon(batched, i)
            await wait_until(lambda: ex._tracker is not None and ex._tracker.inflight == 9)
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


async def test_aclose_timeout_fails_queued_calls_and_lets_running_ones_finish(
    strategy: str, tmp_path: Path
) -> None:
    if strategy == "inline":
        pytest.skip("inline has no queue and nothing running off the loop")
    options, capacity = queued_options(strategy, 50)
    ex = offload.get_executor(strategy, **options)
    # Workers up first (a plugin's may take seconds to start), so the calls
    # below are running, not queued, when the shutdown begins.
    await anyio.to_thread.run_sync(ex.start)
    outcomes: dict[str, Any] = {}

    async def one(tag: str, seconds: float) -> None:
        try:
            outcomes[tag] = await ex.run(faults.square_after, seconds, 3)
        except Exception as exc:
            outcomes[tag] = exc

    async with anyio.create_task_group() as tg:
        for i in range(capacity):
            tg.start_soon(one, f"running{i}", 0.3)
        await wait_until(lambda: ex._tracker is not None and ex._tracker.inflight == capacity)
        await anyio.sleep(0.05)  # let the workers start them
        for i in range(5):
            tg.start_soon(one, f"queued{i}", 0.0)
        await wait_until(lambda: ex._tracker is not None and ex._tracker.inflight == capacity + 5)
        await ex.aclose(timeout=30)
    with pytest.raises(offload.ExecutorClosed):
        await ex.run(helpers.add, 1)
    for i in range(capacity):
        assert outcomes[f"running{i}"] == 9
    for i in range(5):
        assert isinstance(outcomes[f"queued{i}"], offload.ExecutorClosed), outcomes[f"queued{i}"]
        assert "shut down before this call started" in str(outcomes[f"queued{i}"])


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_aclose_timeout_kills_process_workers_still_running(tmp_path: Path) -> None:
    import psutil

    ex = offload.get_executor("process", max_workers=2)
    outcomes: list[Any] = []

    async def one() -> None:
        try:
            outcomes.append(await ex.run(faults.pid_after, 60))
        except Exception as exc:
            outcomes.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(2):
            tg.start_soon(one)
        await wait_until(lambda: len(ex.strategy.worker_pids()) == 2)
        pids = ex.strategy.worker_pids()
        await anyio.sleep(0.2)
        started = time.perf_counter()
        await ex.aclose(timeout=0.5)
        took = time.perf_counter() - started
    assert len(outcomes) == 2
    assert all(isinstance(o, offload.WorkerCrashed) for o in outcomes), outcomes
    assert took < 30  # far below the calls' 60 s
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


async def test_admission_refuses_a_request_early_and_never_halfway(strategy: str, tmp_path: Path) -> None:
    if strategy == "inline":
        pytest.skip("inline has no queue")
    options, capacity = queued_options(strategy, 0)
    gate = str(tmp_path / "gate")
    ex = offload.get_executor(strategy, **options)
    label = "tests.request"
    refused_before = sample("offload_rejected_calls_total", strategy=strategy, function=label, reason="overloaded")
    try:
        assert not ex.overloaded
        async with anyio.create_task_group() as tg:
            with ex.admission(label):
                # One admitted request (holding one place) may put more calls in
                # flight than the bound.
                for i in range(capacity + 3):
                    tg.start_soon(ex.run, faults.gated, gate, str(tmp_path), f"part{i}")
                await wait_until(lambda: ex._tracker is not None and ex._tracker.inflight == capacity + 4)
            assert ex._tracker is not None
            assert ex._tracker.inflight == capacity + 3  # the place was given back
            assert ex.overloaded
            with pytest.raises(offload.Overloaded), ex.admission(label):
                pytest.fail("a full executor admitted a request")
            with pytest.raises(offload.Overloaded):
                await ex.run(helpers.add, 1)  # outside any admitted request
            await anyio.Path(gate).touch()
        assert sorted(os.listdir(tmp_path)) == sorted(["gate", *(f"part{i}" for i in range(capacity + 3))])
        assert sample(
            "offload_rejected_calls_total", strategy=strategy, function=label, reason="overloaded"
        ) == refused_before + 1
        assert not ex.overloaded
    finally:
        await anyio.Path(gate).touch()
        await ex.aclose()


def test_admitted_requests_hold_a_place_until_released(strategy: str) -> None:
    if strategy == "inline":
        pytest.skip("inline has no queue")
    options, capacity = queued_options(strategy, 1)
    ex = offload.get_executor(strategy, **options)
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
        assert ex._tracker is not None
        assert ex._tracker.inflight == 0
    finally:
        ex.shutdown()
