"""`LoopLagMonitor`, and the liveness property it exists to prove."""

from __future__ import annotations

import inspect
import time

import anyio
import pytest

import offload

from . import helpers

pytestmark = pytest.mark.anyio


async def test_monitor_samples_and_reports() -> None:
    async with offload.LoopLagMonitor(interval=0.002) as monitor:
        await anyio.sleep(0.2)
    assert monitor.count > 5
    assert 0.0 <= monitor.p50 <= monitor.p99 <= monitor.max
    assert len(monitor.lags) == monitor.count


async def test_monitor_sees_a_blocked_loop() -> None:
    async with offload.LoopLagMonitor(interval=0.001) as monitor:
        await anyio.sleep(0.02)
        time.sleep(0.3)  # noqa: ASYNC251 (blocking the loop is the point)
        await anyio.sleep(0.02)
    assert monitor.max >= 0.2


def test_bad_interval() -> None:
    for bad in (0, -1, "1ms", True):
        with pytest.raises(offload.ConfigError, match="interval"):
            offload.LoopLagMonitor(interval=bad)  # type: ignore[arg-type]


async def _lag_while_running(strategy: str) -> offload.LoopLagMonitor:
    ex = offload.get_executor(strategy, **({"max_workers": 4} if strategy == "thread" else {}))
    try:
        async with offload.LoopLagMonitor(interval=0.001) as monitor, anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(ex.run, helpers.sleep_and_return, 0.2)
    finally:
        await ex.aclose()
    return monitor


async def test_thread_keeps_the_loop_alive_and_inline_does_not() -> None:
    """Blocking calls that release the GIL: `thread` leaves the loop free, `inline` stalls it.

    Margins are wide on purpose (20 ms against 200 ms stalls): the machine is shared.
    """
    # Up to three tries for `thread`: another job on a shared machine can delay
    # the loop's thread by itself; one clean run shows the strategy keeps it free.
    for _ in range(3):
        threaded = await _lag_while_running("thread")
        if threaded.p99 < 0.020:
            break
    inline = await _lag_while_running("inline")
    assert threaded.count > 50
    assert threaded.p99 < 0.020, threaded
    assert inline.max >= 0.15, inline
    assert inline.p99 > threaded.p99


def test_the_monitor_and_the_metrics_sampler_share_one_default_interval() -> None:
    """One sampler, one default: what `LoopLagMonitor` and `sample_loop_lag`
    do when not told an interval is the same."""
    default = inspect.signature(offload.sample_loop_lag).parameters["interval"].default
    assert offload.LoopLagMonitor().interval == default


async def _raise_in_monitor() -> None:
    async with offload.LoopLagMonitor():
        await anyio.sleep(0.01)
        raise KeyError("body")


async def test_lag_monitor_raises_the_body_exception_unchanged() -> None:
    with pytest.raises(KeyError, match="body"):
        await _raise_in_monitor()
