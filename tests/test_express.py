"""The express worker (`express_cost`, `thread` and `process`): one more
worker that runs only calls priced at most the bound, so a cheap call never
waits for a worker busy with a long call; in the queue's fair order, at the
loop's priority; it fails, restarts and shuts down like the others."""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import offload
from offload import ConfigError, OffloadError, WorkerCrashed
from offload._express import EXPRESS_RATIO
from offload.strategy import Call, Dispatcher

from . import helpers

POOLS = ("thread", "process")


@pytest.fixture(params=POOLS)
def pool(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _executor(strategy: str, **options: Any) -> offload.Executor:
    return offload.get_executor(strategy, max_workers=1, **options)


def _hold(ex: offload.Executor, gate: Path) -> Any:
    """A costly call that holds the regular worker until `gate` exists, once
    it runs (fair queuing would serve a cheap call queued beside it first)."""
    held = ex.options(cost=100).submit(helpers.wait_for_file, str(gate))
    deadline = time.monotonic() + 60
    while not held.running():
        assert time.monotonic() < deadline, "the held call never started"
        time.sleep(0.005)
    return held


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "open"
    yield path
    path.touch()  # never leave a worker held


@pytest.mark.parametrize("express_cost", [10.0, 0.0])
def test_a_cheap_call_skips_the_busy_worker_only_with_an_express_worker(
    pool: str, gate: Path, express_cost: float
) -> None:
    ex = _executor(pool, express_cost=express_cost)
    try:
        ex.submit(helpers.identity, 0).result(timeout=60)  # the regular worker is up
        held = _hold(ex, gate)
        queued = ex.options(cost=100).submit(helpers.identity, "queued")
        cheap = ex.options(cost=10).submit(helpers.where_and_niceness)
        if express_cost:
            _, thread_name, _ = cheap.result(timeout=60)
            assert not held.done()
            assert not queued.done()
            if pool == "thread":
                assert thread_name.endswith("-express")
        else:
            # Without one it waits for the held call, and behind the queued one.
            time.sleep(0.5)
            assert not cheap.done()
        gate.touch()
        assert held.result(timeout=60) == "released"
        assert queued.result(timeout=60) == "queued"
        cheap.result(timeout=60)
    finally:
        gate.touch()
        ex.shutdown(wait=True)


@pytest.mark.parametrize("cost", [26, 100])
def test_a_call_not_far_cheaper_than_the_running_one_waits_for_a_regular_worker(
    pool: str, gate: Path, cost: float
) -> None:
    # The held call costs 100: the express worker takes calls of at most
    # 100 / EXPRESS_RATIO = 25, however high the bound, so that calls of
    # similar sizes (a flood of pieces) share the regular workers and leave
    # it, at the loop's priority, alone.
    assert EXPRESS_RATIO == 4
    ex = _executor(pool, express_cost=1000)
    try:
        held = _hold(ex, gate)
        waiting = ex.options(cost=cost).submit(helpers.where_and_niceness)
        time.sleep(0.5)
        assert not waiting.done()
        cheap = ex.options(cost=25).submit(helpers.where_and_niceness).result(timeout=60)
        assert not waiting.done()
        gate.touch()
        held.result(timeout=60)
        assert waiting.result(timeout=60)[:2] != cheap[:2]
    finally:
        gate.touch()
        ex.shutdown(wait=True)


def test_calls_above_the_bound_never_run_on_the_express_worker(pool: str) -> None:
    ex = _executor(pool, express_cost=10)
    try:
        futures = [ex.options(cost=c).submit(helpers.where_and_niceness) for c in [11, 10.5, 1000] * 10]
        places = {f.result(timeout=60)[:2] for f in futures}
    finally:
        ex.shutdown(wait=True)
    assert len(places) == 1, "only the regular worker ran them"
    if pool == "thread":
        assert not any(name.endswith("-express") for _, name in places)


def test_the_express_worker_keeps_a_flows_order(pool: str, gate: Path) -> None:
    # FIFO is one flow: a cheap call behind a costly queued one waits for it.
    ex = _executor(pool, express_cost=10, scheduling="fifo")
    try:
        ex.submit(helpers.identity, 0).result(timeout=60)
        held = _hold(ex, gate)
        costly = ex.options(cost=100).submit(helpers.identity, "costly")
        cheap = ex.options(cost=1).submit(helpers.identity, "cheap")
        time.sleep(0.5)
        assert not cheap.done()
        gate.touch()
        assert [f.result(timeout=60) for f in (held, costly, cheap)] == ["released", "costly", "cheap"]
    finally:
        gate.touch()
        ex.shutdown(wait=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread niceness is Linux's")
def test_the_express_worker_runs_at_the_callers_priority(pool: str, gate: Path) -> None:
    ex = _executor(pool, express_cost=10)
    try:
        caller = helpers.own_niceness()
        held = _hold(ex, gate)
        regular = ex.options(cost=100).submit(helpers.where_and_niceness)
        express = ex.options(cost=1).submit(helpers.where_and_niceness).result(timeout=60)
        gate.touch()
        held.result(timeout=60)
        assert express[2] == caller
        assert regular.result(timeout=60)[2] == min(19, caller + 10)
    finally:
        gate.touch()
        ex.shutdown(wait=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread niceness is Linux's")
def test_the_express_worker_keeps_the_loops_priority_when_a_worker_makes_the_first_cheap_call() -> None:
    """The first cheap call comes from inside a call on the regular worker
    (nice +10): the express worker still runs at the priority of the thread
    that built the executor, not at the worker's (it inherited it, for the
    executor's life, when that call started it)."""
    ex = _executor("thread", express_cost=10)
    caller = helpers.own_niceness()

    def from_a_worker() -> tuple[int, str, int]:
        # The regular worker runs this (cost 100): the cheap call is the express worker's.
        return ex.options(cost=1).submit(helpers.where_and_niceness).result(timeout=60)

    try:
        _, name, niceness = ex.options(cost=100).submit(from_a_worker).result(timeout=60)
        assert name.endswith("-express"), name
        assert niceness == caller
    finally:
        ex.shutdown(wait=True)


def test_a_crashed_express_worker_fails_its_call_and_is_replaced(tmp_path: Path, gate: Path) -> None:
    ex = _executor("process", express_cost=10)
    try:
        held = _hold(ex, gate)
        with pytest.raises(WorkerCrashed):
            ex.options(cost=1).submit(helpers.kill_self, str(tmp_path)).result(timeout=60)
        pid, _, _ = ex.options(cost=1).submit(helpers.where_and_niceness).result(timeout=60)
        assert not held.done(), "a fresh express worker served it while the other was still held"
        assert str(pid) not in os.listdir(tmp_path)
        gate.touch()
        assert held.result(timeout=60) == "released"
    finally:
        gate.touch()
        ex.shutdown(wait=True)


@pytest.mark.parametrize("cancel_futures", [False, True])
def test_shutdown_ends_every_call_and_joins_the_express_worker(
    pool: str, gate: Path, cancel_futures: bool
) -> None:
    ex = _executor(pool, express_cost=10)
    held = _hold(ex, gate)
    express_held = ex.options(cost=1).submit(helpers.wait_for_file, str(gate))
    while not express_held.running():
        time.sleep(0.005)
    queued = [ex.options(cost=random.choice([1, 100])).submit(helpers.identity, i) for i in range(20)]
    threading.Timer(0.3, gate.touch).start()
    ex.shutdown(wait=True, cancel_futures=cancel_futures)
    assert held.result(timeout=0) == express_held.result(timeout=0) == "released"
    for i, future in enumerate(queued):
        assert future.done()
        if not future.cancelled():
            assert future.result(timeout=0) == i
    if not cancel_futures:
        assert not any(f.cancelled() for f in queued)
    assert not [t for t in threading.enumerate() if t.name.endswith("-express")]


def test_mixed_calls_from_many_threads_each_run_once(pool: str) -> None:
    # Random costs either side of the bound, some withdrawn while queued:
    # every call that is not withdrawn runs exactly once, with its own result.
    ex = offload.get_executor(pool, max_workers=2, express_cost=5)
    futures: dict[int, Any] = {}
    lock = threading.Lock()

    def client(seed: int) -> None:
        rng = random.Random(seed)
        for i in range(60):
            key = seed * 1000 + i
            future = ex.options(cost=rng.choice([0, 1, 5, 6, 50])).submit(helpers.identity, key)
            if rng.random() < 0.2:
                future.cancel()
            with lock:
                futures[key] = future

    try:
        threads = [threading.Thread(target=client, args=(seed,)) for seed in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        for key, future in futures.items():
            if not future.cancelled():
                assert future.result(timeout=60) == key
    finally:
        ex.shutdown(wait=True)
    assert len(futures) == 240


@pytest.mark.parametrize("bad", [-1, float("inf"), float("nan"), True, "1"])
def test_bad_express_costs_are_refused(pool: str, bad: object) -> None:
    with pytest.raises(ConfigError, match="express_cost must be a finite number >= 0"):
        offload.get_executor(pool, express_cost=bad)


def test_a_dispatcher_needs_an_express_slot_maker_for_an_express_slot() -> None:
    class Plain:
        def new_slot(self, number: int) -> int:
            return number

        def start_worker(self, slot: int) -> None: ...

        def worker_ready(self, slot: int) -> bool:
            return True

        def run(self, slot: int, call: Call[Any]) -> None: ...

        def stop_worker(self, slot: int) -> None: ...

    with pytest.raises(OffloadError, match="no express slot"):
        Dispatcher("plain", 1, Plain(), express_cost=1)
    assert Dispatcher("plain", 1, Plain()).express_cost == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_gets_an_express_worker_of_its_own(gate: Path) -> None:
    ex = _executor("thread", express_cost=10)
    try:
        ex.options(cost=1).submit(helpers.identity, 0).result(timeout=60)
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child)
            code = 1
            try:
                held = _hold(ex, gate)
                _, name, _ = ex.options(cost=1).submit(helpers.where_and_niceness).result(timeout=30)
                code = 0 if name.endswith("-express") and not held.done() else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        gate.touch()
        ex.shutdown(wait=True)

