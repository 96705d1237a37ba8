"""The paired benchmark's statistics (benchmarks/harness/stats.py) and /proc reader."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time

import pytest

from benchmarks.harness import procstat, stats


def test_interval_contains_the_median_and_widens_with_fewer_samples() -> None:
    rng = random.Random(1)
    values = [rng.gauss(10, 2) for _ in range(41)]
    interval = stats.median_interval(values)
    assert interval.low <= interval.median <= interval.high
    assert interval.coverage >= 0.95
    few = stats.median_interval(values[:5])
    assert (few.low, few.high) == (min(values[:5]), max(values[:5]))
    assert few.coverage == pytest.approx(1 - 2 / 32)  # the best 5 samples can give


def test_interval_covers_the_true_median_about_as_often_as_it_says() -> None:
    rng = random.Random(7)
    trials, hits = 2000, 0
    for _ in range(trials):
        interval = stats.median_interval([rng.expovariate(1.0) for _ in range(15)])
        hits += interval.contains(0.6931471805599453)  # ln 2, the exponential's median
    assert hits / trials >= 0.93


def test_verdicts() -> None:
    same = stats.median_interval(stats.paired_ratios([1.0, 1.1, 0.9, 1.05, 0.95], [1.0] * 5))
    assert stats.verdict(same, higher="faster", lower="slower") == "no difference"
    faster = stats.median_interval(stats.paired_ratios([2.0, 2.1, 1.9, 2.2, 1.8], [1.0] * 5))
    assert stats.verdict(faster, higher="faster", lower="slower") == "faster"
    slower = stats.median_interval([0.5, 0.6, 0.4, 0.55, 0.45])
    assert stats.verdict(slower, higher="faster", lower="slower") == "slower"
    with pytest.raises(ValueError, match="no values"):
        stats.median_interval([])


def test_procstat_sees_this_thread_burn_cpu() -> None:
    pid = os.getpid()
    before = procstat.snapshot(pid)

    def spin() -> None:
        end = time.process_time() + 0.3
        while time.process_time() < end:
            pass

    worker = threading.Thread(target=spin)
    worker.start()
    worker.join()
    after = procstat.snapshot(pid)
    used = procstat.cpu_used(before, after)
    # The spinning thread is not the main one: the process grew, the main thread hardly.
    assert used["api"] >= 0.1
    assert used["loop"] < used["api"]
    assert used["total"] >= used["api"]


def test_procstat_sees_the_loop_thread_enter_the_kernel() -> None:
    pid = os.getpid()
    before = procstat.snapshot(pid)
    end = time.process_time() + 0.3
    while time.process_time() < end:
        os.stat("/")  # a system call: time in the kernel
    after = procstat.snapshot(pid)
    used = procstat.cpu_used(before, after)
    assert 0 < used["loop_kernel"] <= used["loop"]


_TITLED_CHILD = """
import sys, time
import setproctitle
setproctitle.setproctitle(sys.argv[1])
print("titled", flush=True)
sys.stdin.readline()
end = time.process_time() + float(sys.argv[2])
while time.process_time() < end:
    pass
time.sleep(60)
"""


def test_procstat_counts_api_server_children_as_the_api_servers() -> None:
    """With `--api-server-count N` the process started only waits: its children
    titled as vLLM's API servers are the loops and API-server processes, the
    engine core is counted apart, and the launcher goes with the engine side."""
    titles = {"VLLM::APIServer_0": 0.3, "VLLM::APIServer_1": 0.3, "VLLM::EngineCore_DP0": 0.2}
    children = [
        subprocess.Popen([sys.executable, "-c", _TITLED_CHILD, title, str(seconds)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for title, seconds in titles.items()
    ]
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline() == "titled\n"
        before = procstat.snapshot(os.getpid())  # as a block's: the server's processes all up
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            after = procstat.snapshot(os.getpid())
            used = procstat.cpu_used(before, after)
            if used["api"] >= 0.55 and used["engine_core"] >= 0.18:
                break
            time.sleep(0.1)
    finally:
        for child in children:
            child.kill()
            child.communicate()  # and its pipes closed
    assert before.api_servers == after.api_servers == 2
    assert used["loop"] >= 0.55  # each child spun on its main thread
    assert used["api"] >= 0.55
    assert 0.18 <= used["engine_core"] <= used["engine"]
    assert used["total"] >= used["api"] + used["engine_core"]
