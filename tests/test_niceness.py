"""Workers below the event loop's CPU priority: `thread` workers (each thread
its own niceness, Linux) and `process` workers run at `nice` (default 10) above
the thread that started them; the caller's own priority never changes."""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

import pytest

import offload
from offload import _niceness

from . import helpers

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="threads have a niceness of their own on Linux only"
)


def _worker_niceness(strategy: str, **options: Any) -> tuple[int, int]:
    """(the calling thread's niceness, a worker's) for a fresh executor."""
    ex = offload.get_executor(strategy, max_workers=1, **options)
    try:
        return helpers.own_niceness(), ex.submit(helpers.own_niceness).result(timeout=60)
    finally:
        ex.shutdown(wait=True)


def _in_a_thread_at(niceness: int, fn: Any) -> Any:
    """`fn()` run in a new thread whose niceness was raised to `niceness` (a
    thread's niceness cannot be lowered again without privilege, so never in
    the test's own)."""
    out: list[Any] = []

    def run() -> None:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, niceness)
        out.append(fn())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=120)
    assert out, "the thread did not finish"
    return out[0]


def test_thread_workers_run_ten_below_the_thread_that_started_them() -> None:
    assert _in_a_thread_at(3, lambda: _worker_niceness("thread")) == (3, 13)


def test_thread_workers_with_nice_zero_keep_the_starting_threads_priority() -> None:
    assert _in_a_thread_at(2, lambda: _worker_niceness("thread", nice=0)) == (2, 2)


# A process worker is forked by multiprocessing's forkserver, which has the
# priority of the thread that first started it: this test's main thread.
def test_process_workers_run_ten_below_this_process_by_default() -> None:
    caller, worker = _worker_niceness("process")
    assert worker == min(19, caller + 10)


def test_process_workers_with_nice_zero_run_at_this_processs_priority() -> None:
    caller, worker = _worker_niceness("process", nice=0)
    assert worker == caller


def test_niceness_is_capped_at_19() -> None:
    assert _in_a_thread_at(15, lambda: _worker_niceness("thread", nice=10)) == (15, 19)


def test_the_callers_thread_keeps_its_priority() -> None:
    before = helpers.own_niceness()
    caller, worker = _worker_niceness("thread", nice=7)
    assert caller == before == helpers.own_niceness()
    assert worker == min(19, before + 7)


def test_a_worker_lowers_its_priority_once_though_its_initializer_is_retried(tmp_path: Any) -> None:
    # The initializer fails the first time; the thread tries it again at its
    # next call, and must not add `nice` a second time.
    marker = tmp_path / "failed-once"

    def initializer() -> None:
        if not marker.exists():
            marker.write_text("")
            raise RuntimeError("first start fails")

    def go() -> tuple[int, int]:
        ex = offload.get_executor("thread", max_workers=1, nice=4, initializer=initializer)
        try:
            with pytest.raises(offload.OffloadError):
                ex.submit(helpers.own_niceness).result(timeout=60)
            return helpers.own_niceness(), ex.submit(helpers.own_niceness).result(timeout=60)
        finally:
            ex.shutdown(wait=True)

    assert _in_a_thread_at(1, go) == (1, 5)


@pytest.mark.parametrize("strategy", ["thread", "process"])
@pytest.mark.parametrize("bad", [-1, 20, True, 2.0, "5", None])
def test_a_bad_nice_is_refused(strategy: str, bad: object) -> None:
    with pytest.raises(offload.ConfigError, match="nice must be an integer from 0 to 19"):
        offload.get_executor(strategy, nice=bad)


def test_a_refused_priority_change_is_logged_once_and_the_worker_runs_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Raising niceness needs no privilege, so the OS refusing it (a sandbox's
    # seccomp filter) cannot be caused here: os.setpriority is made to fail.
    def refuse(*args: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "setpriority", refuse)
    monkeypatch.setattr(_niceness, "_warned", False)
    ex = offload.get_executor("thread", max_workers=2)
    try:
        with caplog.at_level(logging.WARNING, logger="offload"):
            before = helpers.own_niceness()
            results = [ex.submit(helpers.own_niceness) for _ in range(8)]
            assert [f.result(timeout=60) for f in results] == [before] * 8
    finally:
        ex.shutdown(wait=True)
    warnings = [r for r in caplog.records if "could not lower a worker thread's priority" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
