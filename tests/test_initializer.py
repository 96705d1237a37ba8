"""A worker's `initializer`: its failure is an `OffloadError` on every
strategy, ends every call queued behind it (also while the executor shuts
down), and a failed `start()` is retried by the next call."""

from __future__ import annotations

import concurrent.futures
import threading
from pathlib import Path

import pytest

import offload

from . import helpers
from .conftest import has_pool, small_options
from .helpers import TIMEOUT

pytestmark = pytest.mark.anyio


async def test_initializer_failure_is_offload_error_on_every_strategy(strategy: str) -> None:
    ex = offload.get_executor(strategy, initializer=helpers.fail_init, **small_options(strategy))
    try:
        with pytest.raises(offload.OffloadError, match="initializer") as info:
            await ex.run(helpers.add, 1, 2)
        assert isinstance(info.value.__cause__, RuntimeError) or "initializer broke" in str(info.value)
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


def test_thread_failing_initializer_ends_every_queued_call() -> None:
    helpers.INIT_GATE.clear()
    ex = offload.get_executor("thread", max_workers=1, initializer=helpers.fail_after_gate)
    try:
        futures = [ex.submit(helpers.add, i) for i in range(4)]  # all queued behind the initializer
        helpers.INIT_GATE.set()
        _, pending = concurrent.futures.wait(futures, timeout=TIMEOUT)
        assert not pending
        for future in futures:
            with pytest.raises(offload.OffloadError, match="initializer"):
                future.result()
    finally:
        helpers.INIT_GATE.set()
        ex.shutdown(wait=True, cancel_futures=True)


def test_thread_shutdown_never_returns_with_calls_pending() -> None:
    helpers.INIT_GATE.clear()
    ex = offload.get_executor("thread", max_workers=1, initializer=helpers.fail_after_gate)
    futures = [ex.submit(helpers.add, i) for i in range(4)]
    stopper = threading.Thread(target=ex.shutdown, daemon=True)
    stopper.start()  # begins while the initializer runs
    helpers.INIT_GATE.set()
    stopper.join(TIMEOUT)
    assert not stopper.is_alive()
    assert all(f.done() for f in futures)


def test_renderer_initializer_failing_during_shutdown_ends_every_queued_call() -> None:
    helpers.INIT_GATE.clear()
    ex = offload.get_executor("async-renderer", initializer=helpers.fail_after_gate)
    try:
        futures = [ex.submit(helpers.add, i) for i in range(3)]
        ex.shutdown(wait=False)  # begins while the initializer runs
        helpers.INIT_GATE.set()
        _, pending = concurrent.futures.wait(futures, timeout=TIMEOUT)
        assert not pending
        for future in futures:
            with pytest.raises(offload.OffloadError, match="initializer"):
                future.result()
    finally:
        helpers.INIT_GATE.set()
        ex.shutdown(wait=True, cancel_futures=True)


def test_a_failed_start_is_retried_by_the_next_call(strategy: str, tmp_path: Path) -> None:
    if strategy == "inline":
        pytest.skip("inline has no workers to start")
    options = small_options(strategy, initializer=helpers.fail_first_time, initargs=(str(tmp_path),))
    if has_pool(strategy):
        options["max_workers"] = 1
    ex = offload.get_executor(strategy, **options)
    try:
        with pytest.raises(offload.OffloadError, match="the first start fails"):
            ex.start()
        for _ in range(3):
            assert ex.submit(helpers.add, 20, 22).result(TIMEOUT) == 42
    finally:
        ex.shutdown(wait=True)
