"""The thread-state sampler the mixed-traffic benchmark reads an API server's
event-loop thread with, on real processes: one idle in its selector, one whose
main thread shares the GIL with a busy thread, one that has gone."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.harness.thread_states import STATES, ThreadStates, classify

IDLE = "import selectors, sys\nprint('ready', flush=True)\nselectors.DefaultSelector().select(timeout=60)"
# The main thread and another both run Python: each waits for the GIL while the other holds it.
CONTENDED = """
import sys, threading
def spin():
    while True:
        sum(range(1000))
threading.Thread(target=spin, daemon=True).start()
print('ready', flush=True)
while True:
    sum(range(1000))
"""


@pytest.fixture
def child(request: pytest.FixtureRequest) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", request.param], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.1)
        yield proc
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def _sample(pid: int, seconds: float = 1.0) -> dict[str, float]:
    with ThreadStates(pid) as states:
        time.sleep(seconds)
    summary = states.summary()
    assert "error" not in summary, summary
    assert summary["samples"] > 50
    assert sum(summary[s] for s in STATES) == pytest.approx(1.0)
    return summary


@pytest.mark.parametrize("child", [IDLE], indirect=True)
def test_a_thread_waiting_in_its_selector_is_idle(child: subprocess.Popen[str]) -> None:
    summary = _sample(child.pid)
    assert summary["idle"] > 0.8, summary
    assert summary["cpu_s_per_s"] < 0.2, summary


@pytest.mark.parametrize("child", [CONTENDED], indirect=True)
def test_a_thread_sharing_the_gil_is_seen_running_and_waiting_for_it(child: subprocess.Popen[str]) -> None:
    summary = _sample(child.pid)
    # Two Python threads take turns holding the GIL (each for up to 5 ms): the
    # main thread spends a good share of its time in futex waiting for it.
    assert summary["lock"] > 0.15, summary
    assert summary["running"] > 0.15, summary
    assert summary["idle"] < 0.1, summary
    assert summary["cpu_s_per_s"] > 0.15, summary


def test_a_process_that_has_gone_is_reported_not_sampled() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(30)
    with ThreadStates(proc.pid) as states:
        pass
    assert "error" in states.summary()


def test_samples_are_classified_by_state_and_wait_channel() -> None:
    stat = "123 (python3 (x)) {} 1 2 3"
    assert classify(stat.format("R"), "0") == "running"
    assert classify(stat.format("S"), "futex_wait_queue") == "lock"
    assert classify(stat.format("S"), "futex_do_wait") == "lock"
    assert classify(stat.format("S"), "ep_poll") == "idle"
    assert classify(stat.format("S"), "do_epoll_wait") == "idle"
    assert classify(stat.format("S"), "poll_schedule_timeout.constprop.0") == "idle"
    assert classify(stat.format("D"), "io_schedule") == "other"


# One process on one CPU with a busy child on the same CPU: each gets about half of it.
SHARED_CPU = """
import os, subprocess, sys, time
from benchmarks.harness.thread_states import own_wait_s
cpu = min(os.sched_getaffinity(0))
os.sched_setaffinity(0, {cpu})
hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # inherits the one CPU
try:
    time.sleep(0.3)
    before, began = own_wait_s(), time.monotonic()
    while time.monotonic() < began + 1.0:
        pass
    print(own_wait_s() - before, time.monotonic() - began)
finally:
    hog.kill()
"""


def test_a_client_sees_its_own_wait_for_a_cpu() -> None:
    # Alone on a CPU it waits for none; beside a busy process on the same CPU
    # it runs about half the time, runnable the rest (1 s spin: about 0.5 s,
    # more on a busy machine), and never waits longer than the time that passed.
    done = subprocess.run([sys.executable, "-c", SHARED_CPU], capture_output=True, text=True, timeout=60,
                          check=True, cwd=Path(__file__).resolve().parents[2])
    waited, elapsed = map(float, done.stdout.split())
    assert 0.15 < waited <= elapsed + 0.01, done.stdout
