"""Shutdown beyond the contract suite: `aclose(timeout=)` stops workers still
starting and refuses a bad timeout, a done-callback may shut down during a
shutdown, futures a shutdown dropped count as done, and the interpreter's exit
never waits for a running `process` call."""

from __future__ import annotations

import concurrent.futures
import os
import time
from pathlib import Path

import anyio
import pytest

import offload

from . import helpers
from .conftest import has_pool, small_options
from .helpers import TIMEOUT
from .in_subprocess import check, run_python

pytestmark = pytest.mark.anyio


async def test_aclose_timeout_stops_a_call_whose_worker_is_still_starting(tmp_path: Path) -> None:
    ex = offload.get_executor(
        "process", max_workers=1, initializer=helpers.sleep_and_return, initargs=(60,)
    )
    marker = tmp_path / "ran"
    future = ex.submit(helpers.write_marker, str(marker))
    await helpers.wait_until(lambda: ex.strategy.worker_pids())  # type: ignore[attr-defined]
    began = time.monotonic()
    await ex.aclose(timeout=0.5)
    took = time.monotonic() - began
    assert took < 15, f"aclose(timeout=0.5) took {took:.1f} s"  # the initializer sleeps 60 s
    # It waited for a worker that never came: dropped with the queue (or, had
    # its slot claimed it, stopped with the worker); it never runs.
    concurrent.futures.wait([future], timeout=TIMEOUT)
    assert future.cancelled() or isinstance(future.exception(), offload.OffloadError)
    await anyio.sleep(0.5)
    assert not marker.exists()


async def test_aclose_timeout_stops_a_replacement_still_starting(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    ex = offload.get_executor(
        "process", max_workers=1, initializer=helpers.slow_after_first, initargs=(str(runs), 60)
    )
    with pytest.raises(offload.WorkerCrashed):
        await ex.run(helpers.kill_self, str(tmp_path))
    # The slot is now starting the dead worker's successor, whose initializer sleeps.
    await helpers.wait_until(lambda: len(list(runs.iterdir())) == 2)
    began = time.monotonic()
    await ex.aclose(timeout=0.5)
    took = time.monotonic() - began
    assert took < 15, f"aclose(timeout=0.5) took {took:.1f} s"


@pytest.mark.parametrize("bad", [-1, "1", float("nan"), True])
async def test_a_bad_aclose_timeout_leaves_the_executor_open(strategy: str, bad: object) -> None:
    ex = offload.get_executor(strategy, **small_options(strategy))
    try:
        with pytest.raises(offload.ConfigError, match="timeout"):
            await ex.aclose(timeout=bad)  # type: ignore[arg-type]
        assert not ex.closed
        assert await ex.run(helpers.add, 20, 22) == 42
    finally:
        await ex.aclose()


def test_done_callback_may_shut_down_during_cancel_futures_shutdown() -> None:
    out = check(
        run_python(
            """
            import threading
            import offload
            from tests import helpers

            if __name__ == "__main__":
                for strategy in ("thread", "process", "async-renderer"):
                    options = {"max_workers": 1} if strategy != "async-renderer" else {}
                    ex = offload.get_executor(strategy, **options)
                    running = ex.submit(helpers.sleep_and_return, 0.5)
                    queued = ex.submit(helpers.add, 1)
                    queued.add_done_callback(lambda f, ex=ex: ex.shutdown(wait=False))
                    stopper = threading.Thread(
                        target=ex.shutdown, kwargs={"cancel_futures": True}, daemon=True
                    )
                    stopper.start()
                    stopper.join(30)
                    print(strategy, "stuck" if stopper.is_alive() else "ok", queued.cancelled())
            """
        )
    )
    for strategy in ("thread", "process", "async-renderer"):
        assert f"{strategy} ok True" in out, out


def test_cancelled_future_dropped_by_shutdown_counts_as_done(strategy: str) -> None:
    # `concurrent.futures.wait` counts a cancelled future only once notified:
    # a queued call whose future was cancelled, then dropped by a shutdown,
    # used to stay "pending" there forever.
    if strategy == "inline":
        pytest.skip("inline runs a call within submit(): nothing queues")
    options = small_options(strategy)
    if has_pool(strategy):
        options["max_workers"] = 1
    ex = offload.get_executor(strategy, **options)
    try:
        running = ex.submit(helpers.sleep_and_return, 0.5)
        queued = [ex.submit(helpers.add, i, 1) for i in range(3)]
        for future in queued:
            assert future.cancel()
        ex.shutdown(wait=False, cancel_futures=True)
        _, pending = concurrent.futures.wait([running, *queued], timeout=TIMEOUT)
        assert not pending
        assert len(list(concurrent.futures.as_completed(queued, timeout=TIMEOUT))) == 3
    finally:
        ex.shutdown(wait=True)


def test_exit_does_not_wait_for_a_running_process_call(tmp_path: Path) -> None:
    result = run_python(
        f"""
        import os, time
        import offload
        from tests import helpers

        if __name__ == "__main__":
            ex = offload.get_executor("process", max_workers=1)
            ex.submit(helpers.write_pid_and_sleep, {str(tmp_path)!r}, 3600)
            ex.submit(helpers.add, 1)  # queued behind it
            while not os.listdir({str(tmp_path)!r}):
                time.sleep(0.05)
            print("exiting", flush=True)
        """,
        timeout=TIMEOUT,
    )
    assert check(result).strip() == "exiting"
    (worker,) = (int(name) for name in os.listdir(tmp_path))
    psutil = pytest.importorskip("psutil")
    try:
        psutil.Process(worker).wait(TIMEOUT)
    except psutil.NoSuchProcess:
        pass
    assert not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE
