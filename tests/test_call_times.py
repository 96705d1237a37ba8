"""`offload.collect_call_times`: the times of the calls made in a context."""

from __future__ import annotations

import time

import anyio
import pytest

import offload

pytestmark = pytest.mark.anyio


def sleep_for(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


async def test_each_finished_call_reports_its_times_in_its_callers_block(executor: offload.Executor) -> None:
    before = time.perf_counter()
    with offload.collect_call_times() as times:
        assert await executor.run(sleep_for, 0.01) == 0.01
        assert await executor.run(sleep_for, 0.0) == 0.0
    # Made outside the block: not collected.
    await executor.run(sleep_for, 0.0)
    assert len(times) == 2
    for queued, started, finished in times:
        assert before <= queued <= started <= finished <= time.perf_counter()
    # The first ran for its sleep (its worker's clock is this process's).
    assert times[0][2] - times[0][1] >= 0.009


async def test_blocks_nest_and_concurrent_tasks_keep_their_own(executor: offload.Executor) -> None:
    inner_counts: list[int] = []

    async def task(calls: int) -> None:
        with offload.collect_call_times() as mine:
            for _ in range(calls):
                await executor.run(sleep_for, 0.0)
        inner_counts.append(len(mine))

    with offload.collect_call_times() as outer_times:
        async with anyio.create_task_group() as tg:
            tg.start_soon(task, 1)
            tg.start_soon(task, 3)
    assert sorted(inner_counts) == [1, 3]
    assert outer_times == []


async def test_a_call_withdrawn_before_it_started_reports_nothing() -> None:
    executor = offload.get_executor("thread", max_workers=1)
    release = anyio.Event()
    try:
        with offload.collect_call_times() as times:
            async with anyio.create_task_group() as tg:
                blocker = executor.submit(time.sleep, 0.2)

                async def queued() -> None:
                    with anyio.move_on_after(0.05):
                        await executor.run(sleep_for, 0.0)
                    release.set()

                tg.start_soon(queued)
            await release.wait()
            blocker.result(timeout=5)
        # The blocker (submitted in the block) finished; the withdrawn call did not report.
        assert len(times) == 1
    finally:
        executor.shutdown(wait=True)
