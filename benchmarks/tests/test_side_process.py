"""The helper process the benchmarks' flood, `/health` prober and thread sampler
run in: a helper that never starts, or never answers, is killed, not waited on;
one that dies is noticed at once."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from benchmarks.harness.side_process import SideProcess


def _answers(value: int, ready: Any, stop: Any, out: Any) -> None:
    ready.set()
    while not stop.is_set():  # polled, as every helper must (see SideProcess)
        time.sleep(0.01)
    out.send(value * 2)


def _never_ready(ready: Any, stop: Any, out: Any) -> None:
    time.sleep(600)


def _never_answers(ready: Any, stop: Any, out: Any) -> None:
    ready.set()
    time.sleep(600)  # ignores stop


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_helpers_result_comes_back_after_the_block() -> None:
    with SideProcess(_answers, (21,), what="doubler", start_timeout=60, result_timeout=60) as side:
        pass
    assert side.result == 42
    assert not side._proc.is_alive()


def test_a_helper_that_never_starts_is_killed_and_named() -> None:
    side = SideProcess(_never_ready, (), what="the sleepy helper", start_timeout=0.5, result_timeout=1)
    with pytest.raises(RuntimeError, match="the sleepy helper did not start"), side:
        pytest.fail("the block ran")
    pid = side._proc.pid
    assert pid is not None
    assert not _alive(pid)


def test_a_helper_that_never_answers_is_killed_and_gives_no_result() -> None:
    started = time.monotonic()
    with SideProcess(_never_answers, (), what="mute", start_timeout=60, result_timeout=0.5) as side:
        pid = side._proc.pid
    assert side.result is None
    assert time.monotonic() - started < 60  # not the helper's 600 s
    assert pid is not None
    assert not _alive(pid)


def test_a_helper_that_dies_gives_no_result_without_waiting_out_the_timeout() -> None:
    started = time.monotonic()
    with SideProcess(_answers, (21,), what="doomed", start_timeout=60, result_timeout=60) as side:
        pid = side._proc.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        side._proc.join(30)
    assert side.result is None
    assert time.monotonic() - started < 30  # not the 60 s result timeout
