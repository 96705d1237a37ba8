"""The semantics every strategy shares, on every backend (anyio_backend × strategy)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
import traceback
from pathlib import Path

import anyio
import pytest

import offload

from . import helpers
from .conftest import has_pool, small_options

pytestmark = pytest.mark.anyio


async def test_run_returns_result(executor: offload.Executor) -> None:
    assert await executor.run(helpers.add, 2, b=3) == 5
    assert await executor.run(helpers.echo_args, 1, "x", k=[1, 2]) == ((1, "x"), {"k": [1, 2]})


async def test_exception_type_message_and_frames(executor: offload.Executor) -> None:
    with pytest.raises(helpers.CustomError, match="^boom$") as info:
        await executor.run(helpers.raise_custom, "boom")
    text = "".join(traceback.format_exception(info.value))
    assert "raise_custom" in text
    assert "helpers.py" in text


async def test_many_concurrent_calls_each_get_their_own_result(executor: offload.Executor) -> None:
    results: dict[int, int] = {}

    async def one(i: int) -> None:
        results[i] = await executor.run(helpers.add, i, b=1000)

    async with anyio.create_task_group() as tg:
        for i in range(200):
            tg.start_soon(one, i)
    assert results == {i: i + 1000 for i in range(200)}


async def test_submit_and_map(executor: offload.Executor) -> None:
    future = executor.submit(helpers.add, 1, b=2)
    assert await anyio.to_thread.run_sync(future.result, 30) == 3
    assert list(executor.map(helpers.add, [1, 2, 3], [10, 20, 30])) == [11, 22, 33]
    failing = executor.submit(helpers.raise_value_error, "nope")
    with pytest.raises(ValueError, match="nope"):
        await anyio.to_thread.run_sync(failing.result, 30)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_drops_into_run_in_executor(executor: offload.Executor) -> None:
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(executor, helpers.add, 40, 2) == 42


async def test_closed_executor_refuses_calls(strategy: str) -> None:
    ex = offload.get_executor(strategy, **small_options(strategy))
    assert await ex.run(helpers.add, 1) == 1
    await ex.aclose()
    assert ex.closed
    with pytest.raises(offload.ExecutorClosed):
        await ex.run(helpers.add, 1)
    with pytest.raises(offload.ExecutorClosed):
        ex.submit(helpers.add, 1)
    ex.shutdown()  # idempotent


async def test_context_managers(strategy: str) -> None:
    async with offload.get_executor(strategy, **small_options(strategy)) as ex:
        assert await ex.run(helpers.add, 1, 1) == 2
    assert ex.closed
    with offload.get_executor(strategy, **small_options(strategy)) as ex2:
        assert ex2.submit(helpers.add, 2, 2).result(timeout=30) == 4
    assert ex2.closed


async def test_shutdown_leaves_no_threads_behind(strategy: str) -> None:
    before = set(threading.enumerate())
    ex = offload.get_executor(strategy, **small_options(strategy))
    async with anyio.create_task_group() as tg:
        for _ in range(8):
            tg.start_soon(ex.run, helpers.sleep_and_return, 0.01)
    await ex.aclose()
    # anyio's own to_thread worker (used by aclose) is idle and may linger: it is not ours.
    leftover = [t for t in set(threading.enumerate()) - before if t.name.startswith("offload")]
    assert leftover == []


def _markers(path: Path) -> int:
    return path.read_text().count("ran") if path.exists() else 0


async def test_cancelled_call_that_has_not_started_never_runs(strategy: str, tmp_path: Path) -> None:
    if strategy == "inline":
        pytest.skip("inline has no queue: every call starts at once")
    ex = offload.get_executor(strategy, **small_options(strategy, max_workers=1) if has_pool(strategy) else {})
    try:
        blocker = tmp_path / "blocker"
        queued = tmp_path / "queued"
        async with anyio.create_task_group() as tg:
            tg.start_soon(ex.run, helpers.write_marker, str(blocker), 0.5)
            await anyio.sleep(0.1)
            with anyio.CancelScope() as scope:
                scope.cancel()
                await ex.run(helpers.write_marker, str(queued))
        await anyio.sleep(0.3)
        assert _markers(blocker) == 1
        assert _markers(queued) == 0
        assert await ex.run(helpers.add, 1, 2) == 3
    finally:
        await ex.aclose()


async def test_cancelling_a_running_call_returns_at_once_and_it_finishes(strategy: str, tmp_path: Path) -> None:
    if strategy == "inline":
        pytest.skip("inline runs on the loop: nothing can cancel it mid-call")
    ex = offload.get_executor(strategy, **small_options(strategy))
    try:
        await ex.run(helpers.add, 1, 2)  # workers up: the call below starts at once
        marker = tmp_path / "m"
        with anyio.move_on_after(0.3) as scope:
            await ex.run(helpers.write_marker, str(marker), 1.0)
        assert scope.cancelled_caught
        assert _markers(marker) == 0  # returned before the call finished
        with anyio.fail_after(30):
            while _markers(marker) == 0:  # noqa: ASYNC110 (polling a file another process writes)
                await anyio.sleep(0.05)
    finally:
        await ex.aclose()


var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")


def _read_var() -> str:
    value = var.get()
    var.set("changed-in-worker")
    return value


async def test_contextvars_are_copied_into_the_worker(executor: offload.Executor, strategy: str) -> None:
    if not executor.carries_context:
        pytest.skip(f"{strategy} cannot carry a contextvars.Context across the process boundary")
    token = var.set("from-caller")
    try:
        assert await executor.run(_read_var) == "from-caller"
        assert var.get() == "from-caller"  # the worker's change stays in its copy
    finally:
        var.reset(token)


async def test_concurrency_bound_holds(strategy: str, tmp_path: Path) -> None:
    if strategy == "inline":
        pytest.skip("inline runs one call at a time on the loop")
    from .test_properties import peak_concurrency

    bound = 2 if strategy != "async-renderer" else 1
    ex = offload.get_executor(strategy, **small_options(strategy))
    try:
        peak = await peak_concurrency(ex, tmp_path, calls=12, hold=0.05)
    finally:
        await ex.aclose()
    assert 1 <= peak <= bound


async def test_initializer_builds_one_state_per_worker(strategy: str) -> None:
    ex = offload.get_executor(
        strategy, **small_options(strategy, initializer=helpers.make_state, initargs=("T",))
    )
    try:
        states = []
        async with anyio.create_task_group() as tg:

            async def one() -> None:
                states.append(await ex.run(helpers.read_state))

            for _ in range(40):
                tg.start_soon(one)
    finally:
        await ex.aclose()
    assert all(s["tag"] == "T" for s in states)
    # Each worker has its own state object: calls per worker add up to the total,
    # and two workers never report the same (pid, thread) with diverging counts.
    workers: dict[tuple[int, int], int] = {}
    for s in states:
        key = (s["pid"], s["thread"])
        workers[key] = max(workers.get(key, 0), s["calls"])
    assert sum(workers.values()) == 40


async def test_worker_state_outside_a_worker_is_an_error() -> None:
    with pytest.raises(offload.OffloadError, match="worker_state"):
        offload.worker_state()


async def test_executor_works_across_event_loops(strategy: str) -> None:
    """An executor made at import time serves whatever loop calls it."""
    ex = offload.get_executor(strategy, **small_options(strategy))
    try:
        assert await ex.run(helpers.add, 1, 1) == 2
        other = await anyio.to_thread.run_sync(
            lambda: anyio.run(ex.run, helpers.add, 2, 2, backend="trio")
        )
        assert other == 4
    finally:
        await ex.aclose()


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


def test_shutdown_cancel_futures_drops_queued_calls(tmp_path: Path) -> None:
    ex = offload.get_executor("thread", max_workers=1)
    running = ex.submit(helpers.sleep_and_return, 0.3, "done")
    queued = [ex.submit(helpers.write_marker, str(tmp_path / "q")) for _ in range(5)]
    ex.shutdown(wait=True, cancel_futures=True)
    assert running.result(timeout=0) == "done"
    assert all(f.cancelled() for f in queued)
    assert _markers(tmp_path / "q") == 0
    with pytest.raises(concurrent.futures.CancelledError):
        queued[0].result(timeout=0)


# ---- start(): workers up before the first call ------------------------------


def _init_runs(directory: Path) -> tuple[list[str], int]:
    """The files `helpers.count_init` wrote (one per worker process) and its runs."""
    files = sorted(directory.iterdir())
    return [p.name for p in files], sum(len(p.read_text().splitlines()) for p in files)


def _starts_workers(ex: offload.Executor) -> bool:
    return type(ex.strategy).start is not offload.strategy.Strategy.start


async def test_start_warms_every_worker_before_the_first_call(strategy: str, tmp_path: Path) -> None:
    ex = offload.get_executor(
        strategy, **small_options(strategy, initializer=helpers.count_init, initargs=(str(tmp_path),))
    )
    try:
        await anyio.to_thread.run_sync(ex.start)
        if not _starts_workers(ex):
            assert _init_runs(tmp_path) == ([], 0)  # inline: nothing to start, nothing ran
            return
        # One initializer run per worker (thread workers share this pid: one file, one line each).
        started, runs = _init_runs(tmp_path)
        assert runs == getattr(ex.strategy, "max_workers", 1)
        await anyio.to_thread.run_sync(ex.start)  # idempotent
        for _ in range(20):
            await ex.run(helpers.add, 1, 1)
        # The calls ran on the workers start() made: no worker was started for them.
        assert _init_runs(tmp_path) == (started, runs)
    finally:
        await ex.aclose()
    with pytest.raises(offload.ExecutorClosed):
        ex.start()


async def test_start_reports_a_failing_initializer(strategy: str) -> None:
    ex = offload.get_executor(strategy, **small_options(strategy, initializer=helpers.fail_init))
    try:
        if not _starts_workers(ex):
            ex.start()  # nothing to start: the initializer's failure shows at the first call
            return
        with pytest.raises(offload.OffloadError) as info:
            await anyio.to_thread.run_sync(ex.start)
        assert "initializer broke" in repr(info.value) + repr(info.value.__cause__)
        # The executor still works as it would without start(): calls fail the same way, and end.
        with anyio.fail_after(60), pytest.raises(offload.OffloadError):
            await ex.run(helpers.add, 1, 1)
    finally:
        with anyio.fail_after(60):
            await ex.aclose()
