"""Failure paths, second round: each test injects the failure for
real (a real fork, rlimits, a thread that cannot start, a worker still
starting) and failed on the code before the fix.

Scenarios that could hang on a regression run in a subprocess with a timeout
(and an alarm in any forked child), so a regression fails instead of hanging
the suite.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

import offload
from offload import _metrics

from . import faults, helpers
from .conftest import has_pool, small_options
from .test_failures import TIMEOUT, check, run_python

pytestmark = pytest.mark.anyio

prometheus_client = pytest.importorskip("prometheus_client")


def sample(name: str, **labels: str) -> float:
    return prometheus_client.REGISTRY.get_sample_value(name, labels) or 0.0


async def wait_until(predicate: Any, seconds: float = 30.0) -> None:
    with anyio.fail_after(seconds):
        while not predicate():  # noqa: ASYNC110 (state other threads and processes change)
            await anyio.sleep(0.005)


# ---- 1. a child forked after the parent started a forkserver -------------------------

FORK_AFTER_FORKSERVER = """
import gc, multiprocessing, os, signal, sys, threading
how = sys.argv[1]
if how != "offload-imported-late":
    import offload
from tests import helpers

if __name__ == "__main__":
    if how == "executor-used-and-gone":
        ex = offload.get_executor("process", max_workers=1)
        assert ex.submit(helpers.add, 1, 2).result(60) == 3
        ex.shutdown()
        del ex
        gc.collect()
    elif how in ("plain-multiprocessing", "offload-imported-late"):
        process = multiprocessing.get_context("forkserver").Process(target=helpers.add, args=(1,))
        process.start()
        process.join()
    elif how == "forkserver-lock-held":
        # As if another thread were starting the forkserver at the fork.
        from multiprocessing import forkserver
        forkserver._forkserver._lock.acquire()
    pid = os.fork()
    if pid == 0:
        signal.alarm(60)  # a hung child must not outlive the test
        code = 1
        try:
            import offload
            ex = offload.get_executor("process", max_workers=1)
            print("child got", ex.submit(helpers.add, 20, 22).result(60), flush=True)
            ex.shutdown()
            code = 0
        except BaseException as exc:
            print("child failed:", repr(exc), flush=True)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print("child exit", os.waitstatus_to_exitcode(status), flush=True)
"""


@pytest.mark.parametrize(
    "how",
    ["executor-used-and-gone", "plain-multiprocessing", "forkserver-lock-held", "offload-imported-late"],
)
def test_a_process_executor_made_in_a_forked_child_works_whatever_the_parent_did(how: str) -> None:
    out = check(run_python(FORK_AFTER_FORKSERVER.replace("sys.argv[1]", repr(how)), timeout=120))
    assert "child got 42" in out, out
    assert "child exit 0" in out, out


# ---- 2. a failed shared-memory map never poisons the arena ------------------------------


async def test_a_worker_that_could_not_map_an_argument_maps_the_next_one() -> None:
    ex = offload.get_executor("process", max_workers=1)
    try:
        pid = await ex.run(helpers.pid)
        # Through shared memory: 8 MiB makes an arena the worker maps.
        assert await ex.run(helpers.describe, b"x" * (8 << 20)) == ("bytes", 8 << 20)
        soft = await ex.run(helpers.limit_address_space, 1 << 20)
        # 16 MiB needs a new, larger arena, and no room is left to map it.
        larger = b"y" * (16 << 20)
        with pytest.raises(TypeError, match="could not unpickle the call.*(Cannot allocate|MemoryError|mmap)"):
            await ex.run(helpers.describe, larger)
        await ex.run(helpers.restore_address_space, soft)
        # Memory is back: the same arena maps now (before the fix its file was
        # gone, and every large argument failed with FileNotFoundError), in
        # the same worker.
        for _ in range(2):
            assert await ex.run(helpers.describe, larger) == ("bytes", 16 << 20)
        assert await ex.run(helpers.pid) == pid
    finally:
        await ex.aclose()


def test_a_parent_that_could_not_map_a_reply_maps_the_next_one() -> None:
    out = check(
        run_python(
            """
            import resource
            import offload
            from tests import helpers

            if __name__ == "__main__":
                ex = offload.get_executor("process", max_workers=1)
                # 8 MiB makes an arena this process maps; 16 MiB needs a larger one.
                assert len(ex.submit(helpers.make_bytes, 8 << 20).result(timeout=60)) == 8 << 20
                pid = ex.submit(helpers.pid).result(timeout=60)
                soft, hard = resource.getrlimit(resource.RLIMIT_AS)
                resource.setrlimit(resource.RLIMIT_AS, (helpers.vm_size() + (1 << 20), hard))
                try:
                    ex.submit(helpers.make_bytes, 16 << 20).result(timeout=60)
                except Exception as exc:
                    print("failed:", type(exc).__name__, exc)
                else:
                    print("no failure")
                resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
                for _ in range(3):
                    print("got", len(ex.submit(helpers.make_bytes, 16 << 20).result(timeout=60)))
                print("same worker", ex.submit(helpers.pid).result(timeout=60) == pid)
                ex.shutdown()
            """
        )
    )
    assert "failed: OffloadError" in out, out  # the limit bit
    assert "mmap" in out or "Cannot allocate" in out, out  # it was the map that failed
    assert out.count(f"got {16 << 20}") == 3, out
    assert "same worker True" in out, out


# ---- 4. aclose(timeout=) stops a worker that is still starting --------------------------


async def test_aclose_timeout_stops_a_call_whose_worker_is_still_starting(tmp_path: Path) -> None:
    ex = offload.get_executor(
        "process", max_workers=1, initializer=helpers.sleep_and_return, initargs=(60,)
    )
    marker = tmp_path / "ran"
    future = ex.submit(helpers.write_marker, str(marker))
    await wait_until(lambda: ex.strategy.worker_pids())  # type: ignore[attr-defined]
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
    await wait_until(lambda: len(list(runs.iterdir())) == 2)
    began = time.monotonic()
    await ex.aclose(timeout=0.5)
    took = time.monotonic() - began
    assert took < 15, f"aclose(timeout=0.5) took {took:.1f} s"


# ---- 6. a worker thread that cannot start ------------------------------------------------

THREAD_CANNOT_START = """
import resource, sys, threading, time
import offload, prometheus_client
from offload import _metrics
from tests import faults, helpers

strategy, busy = sys.argv[1], sys.argv[2] == "busy"

def queued():
    return prometheus_client.REGISTRY.get_sample_value(
        "offload_queued_calls", {"strategy": strategy, "function": _metrics.function_label(helpers.write_marker)}
    ) or 0.0

if __name__ == "__main__":
    options = {} if strategy == "async-renderer" else {"max_workers": 2}
    ex = offload.get_executor(strategy, **options)
    gate, started, marker = sys.argv[3] + "/gate", sys.argv[3] + "/started", sys.argv[3] + "/ran"
    held = None
    if busy:
        held = ex.submit(faults.hold_until, gate, started)
        while not __import__("os").path.exists(started):
            time.sleep(0.01)
    # Every new thread maps its stack: leave no room for one.
    threading.stack_size(256 << 20)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (helpers.vm_size() + (32 << 20), hard))
    try:
        future = ex.submit(helpers.write_marker, marker)
    except offload.OffloadError as exc:
        print("refused:", exc)
        future = None
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        threading.stack_size(0)
    open(gate, "w").close()
    if future is not None:
        print("queued call result", future.result(60) == marker)
    time.sleep(0.5)
    print("marker written", __import__("os").path.exists(marker))
    print("queued gauge", queued())
    print("later call", ex.submit(helpers.add, 20, 22).result(60))
    ex.shutdown(wait=True)
    print("shut down")
    # A worker started since (for the later call) would have found a refused
    # call still queued and run it.
    print("marker written at the end", __import__("os").path.exists(marker))
"""


@pytest.mark.parametrize("strategy", ["thread", "process", "async-renderer"])
def test_a_call_whose_worker_thread_cannot_start_fails_and_never_runs(strategy: str, tmp_path: Path) -> None:
    code = THREAD_CANNOT_START.replace("sys.argv[1]", repr(strategy)).replace(
        "sys.argv[2]", repr("idle")
    ).replace("sys.argv[3]", repr(str(tmp_path)))
    out = check(run_python(code, timeout=120))
    assert "refused: " in out, out
    assert "could not start" in out, out
    assert "marker written False" in out, out  # it failed, so it must never run
    assert "queued gauge 0.0" in out, out
    assert "later call 42" in out, out
    assert "shut down" in out, out
    assert "marker written at the end False" in out, out


@pytest.mark.parametrize("strategy", ["thread", "process"])
def test_a_call_that_finds_a_busy_worker_waits_for_it_when_no_new_thread_can_start(
    strategy: str, tmp_path: Path
) -> None:
    code = THREAD_CANNOT_START.replace("sys.argv[1]", repr(strategy)).replace(
        "sys.argv[2]", repr("busy")
    ).replace("sys.argv[3]", repr(str(tmp_path)))
    out = check(run_python(code, timeout=120))
    assert "refused" not in out, out
    assert "queued call result True" in out, out
    assert "queued gauge 0.0" in out, out
    assert "shut down" in out, out


# ---- 7. a cancelled submit() gives its place back ------------------------------------------


@pytest.mark.parametrize("anyio_backend", [pytest.param(("asyncio", {}), id="asyncio")])
async def test_a_cancelled_run_in_executor_gives_its_place_back_at_once(strategy: str, tmp_path: Path) -> None:
    if strategy == "inline":
        pytest.skip("inline has no queue")
    options = small_options(strategy, max_queue=1)
    if has_pool(strategy):
        options["max_workers"] = 1
    else:
        options["max_batch_size"] = 1
    ex = offload.get_executor(strategy, **options)
    gate, started = tmp_path / "gate", tmp_path / "started"
    try:
        held = ex.submit(faults.hold_until, str(gate), str(started))
        await wait_until(started.exists)
        loop = asyncio.get_running_loop()
        waiting = asyncio.ensure_future(loop.run_in_executor(ex, helpers.add, 1, 2))
        await wait_until(lambda: ex.in_flight == 2)
        with pytest.raises(offload.Overloaded):
            ex.submit(helpers.add, 0, 0)  # full: one running, one queued
        waiting.cancel()
        await wait_until(lambda: ex.in_flight == 1)
        admitted = ex.submit(helpers.add, 2, 3)  # the cancelled one's place
        gate.touch()
        assert admitted.result(TIMEOUT) == 5
        assert held.result(TIMEOUT) == "held"
    finally:
        gate.touch()
        await ex.aclose()


# ---- 8. a failed start() never hands its error to a later call -----------------------------


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


# ---- 10. offload's own kills are not crashes -----------------------------------------------


async def test_kills_offload_orders_are_counted_as_stopped_calls_not_crashes(tmp_path: Path) -> None:
    ex = offload.get_executor("process", max_workers=1, cancel="kill")
    fn = _metrics.function_label(helpers.sleep_and_return)
    crashed = sample("offload_crashed_calls_total", strategy="process", function=fn)
    dropped = {
        reason: sample("offload_dropped_calls_total", strategy="process", function=fn, reason=reason)
        for reason in ("deadline", "cancelled", "shutdown")
    }
    restarts = {
        reason: sample("offload_worker_restarts_total", strategy="process", reason=reason)
        for reason in ("crashed", "killed")
    }
    try:
        await ex.run(helpers.pid)  # a worker up
        with pytest.raises(TimeoutError):
            await ex.run_with_timeout(0.5, helpers.sleep_and_return, 60)
        with anyio.move_on_after(0.5):
            await ex.run(helpers.sleep_and_return, 60)
        await wait_until(
            lambda: sample("offload_worker_restarts_total", strategy="process", reason="killed")
            == restarts["killed"] + 2
        )
        pending = ex.submit(helpers.sleep_and_return, 60)
        await wait_until(lambda: ex.in_flight == 1)
        # Claimed by its slot (a busy machine can take a while to restart the
        # killed worker), then sent to the worker.
        await wait_until(pending.running)
        await anyio.sleep(0.2)
    finally:
        await ex.aclose(timeout=0.2)
    with pytest.raises(offload.WorkerCrashed):
        pending.result(TIMEOUT)
    assert sample("offload_crashed_calls_total", strategy="process", function=fn) == crashed
    assert sample("offload_worker_restarts_total", strategy="process", reason="crashed") == restarts["crashed"]
    for reason in ("deadline", "cancelled", "shutdown"):
        assert sample(
            "offload_dropped_calls_total", strategy="process", function=fn, reason=reason
        ) == dropped[reason] + 1, reason


# ---- 11. a bad argument changes nothing ------------------------------------------------------


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


# ---- metrics' locks at fork -----------------------------------------------------------------


def test_a_child_forked_while_a_metric_lock_was_held_can_count() -> None:
    out = check(
        run_python(
            """
            import os, signal
            import offload
            from offload import _metrics
            from tests import helpers

            if __name__ == "__main__":
                ex = offload.get_executor("thread", max_workers=1)
                assert ex.submit(helpers.add, 1, 2).result(60) == 3
                families = _metrics._Families.get()
                # A worker of the parent counting a call at the fork holds this lock.
                child = families.queued.labels("thread", _metrics.function_label(helpers.add))
                child._value._lock.acquire()
                pid = os.fork()
                if pid == 0:
                    signal.alarm(60)
                    code = 1
                    try:
                        print("child got", ex.submit(helpers.add, 20, 22).result(30), flush=True)
                        code = 0
                    finally:
                        os._exit(code)
                child._value._lock.release()
                _, status = os.waitpid(pid, 0)
                print("child exit", os.waitstatus_to_exitcode(status), flush=True)
                ex.shutdown()
            """
        )
    )
    assert "child got 42" in out, out
    assert "child exit 0" in out, out


# ---- a slot that exits at shutdown while a call is in transit ------------------------------


class _TokensWithPauses:
    """The dispatcher's token queue, with a pause where the OS may preempt a
    slot thread: the first slot pauses *before* it waits for a token, the
    second *after* it took one and before it takes the lock (its call is then
    "in transit"). Everything else goes to the real queue."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self._order: list[str] = []
        self.armed = False
        self.first_may_wait = threading.Event()
        self.second_took_one = threading.Event()
        self.second_may_go = threading.Event()

    @property
    def first_slot(self) -> str:
        return self._order[0]

    def _role(self) -> int:
        name = threading.current_thread().name
        if name not in self._order:
            self._order.append(name)
        return self._order.index(name)

    def get(self) -> Any:
        role = self._role()
        if self.armed and role == 0:
            self.first_may_wait.wait(30)
        token = self._real.get()
        if self.armed and role == 1 and token is not None and not self.second_took_one.is_set():
            self.second_took_one.set()
            self.second_may_go.wait(30)
        return token

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_shutdown_ends_when_a_slot_exits_while_another_takes_the_last_call() -> None:
    """Found by the interleaving property: a slot that got its stop token
    while the last queued call was in transit to another slot started a
    replacement that no stop token reached, and `shutdown(wait=True)` hung."""
    ex = offload.get_executor("thread", max_workers=2)
    dispatch = ex.strategy._dispatch  # type: ignore[attr-defined]
    tokens = _TokensWithPauses(dispatch._tokens)
    dispatch._tokens = tokens  # before any slot starts: slots read it once
    release = [threading.Event(), threading.Event()]
    try:
        busy = [ex.submit(event.wait, 30) for event in release]  # slots A and B
        tokens.armed = True
        for event in release:
            event.set()
        for future in busy:
            assert future.result(30)
        time.sleep(0.2)  # both slots idle: A paused, B waiting for a token
        third = ex.submit(helpers.add, 1, 2)  # B takes it and pauses before the lock
        assert tokens.second_took_one.wait(30)
        fourth = ex.submit(helpers.add, 3, 4)  # reserved for A, queued
        ex.shutdown(wait=False, cancel_futures=True)  # drops the fourth, keeps the third
        first = next(t for t in threading.enumerate() if t.name == tokens.first_slot)
        tokens.first_may_wait.set()  # A takes a stop token and exits
        first.join(30)
        tokens.second_may_go.set()
        assert third.result(30) == 3
        assert fourth.cancelled()
        stopper = threading.Thread(target=ex.shutdown, daemon=True)
        stopper.start()
        stopper.join(30)
        assert not stopper.is_alive(), "shutdown(wait=True) hung"
    finally:
        tokens.first_may_wait.set()
        tokens.second_may_go.set()
        for event in release:
            event.set()


# ---- the dispatcher: calls stranded when no slot can start --------------------------

#: A thread stack no address space holds: while it is set, no thread can start.
NO_THREAD_STACK = 1 << 47


class _SlotsThatMayFail:
    """A `SlotWorker` (public interface) whose worker runs calls in the slot
    thread, and raises, as a buggy strategy would, on a call whose first
    argument is `"bug"`, once `bug_may_raise` is set."""

    def __init__(self) -> None:
        self.bug_may_raise = threading.Event()

    def new_slot(self, number: int) -> int:
        return number

    def start_worker(self, slot: int) -> None:
        pass

    def worker_ready(self, slot: int) -> bool:
        return True

    def run(self, slot: int, call: offload.strategy.Call[Any]) -> None:
        if call.args[:1] == ("bug",):
            self.bug_may_raise.wait(30)
            raise RuntimeError("a bug in the strategy")
        call.execute()

    def stop_worker(self, slot: int) -> None:
        pass


# The lane of the calls these tests hand a `Dispatcher` directly (an executor stamps its own).
_LANE = offload.strategy.Lane("default")


def _lane_call(fn: Any, args: tuple[Any, ...]) -> offload.strategy.Call[Any]:
    call: offload.strategy.Call[Any] = offload.strategy.Call(fn, args, {})
    call.lane = _LANE
    return call


def _ended(call: offload.strategy.Call[Any], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not call.done:
        assert time.monotonic() < deadline, "the call never ended"
        time.sleep(0.005)


def test_calls_stranded_without_a_slot_fail_and_leave_the_dispatcher_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """The last slot dies (a strategy bug) with a call queued, and no thread can
    start to take it: the call fails at once rather than waiting forever, and
    nothing of it stays behind. Its token did before: the next slot counted it
    as a call, took it as a second idle slot, and so started no second slot
    for a second call (two calls that wait for each other never met)."""
    died: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    worker = _SlotsThatMayFail()
    dispatch: offload.strategy.Dispatcher[int] = offload.strategy.Dispatcher("strand-test", 2, worker)
    buggy = _lane_call(helpers.identity, ("bug",))
    queued = _lane_call(helpers.identity, ("queued",))
    dispatch.put(buggy)  # slot 0 takes it and waits
    deadline = time.monotonic() + 30
    while not dispatch.running():
        assert time.monotonic() < deadline
        time.sleep(0.005)
    threading.stack_size(NO_THREAD_STACK)
    try:
        dispatch.put(queued)  # no second slot can start: queued for slot 0
        worker.bug_may_raise.set()  # slot 0 dies; no slot can start to take `queued`
        _ended(buggy)
        _ended(queued)
    finally:
        threading.stack_size(0)
    assert isinstance(buggy.error, offload.OffloadError), buggy.error
    assert "failed" in str(buggy.error)
    assert isinstance(queued.error, offload.OffloadError), queued.error
    assert "could not start a slot thread" in str(queued.error)
    assert [type(e) for e in died] == [RuntimeError]

    # Threads can start again: the dispatcher serves, with both slots.
    after = _lane_call(helpers.identity, ("after",))
    dispatch.put(after)
    _ended(after)
    assert after.outcome() == "after"
    meet = threading.Barrier(2, timeout=10)
    pair = [_lane_call(meet.wait, ()) for _ in range(2)]
    for call in pair:
        dispatch.put(call)
    for call in pair:
        _ended(call)
    assert [call.error for call in pair] == [None, None], "the two calls did not run at once"
    dispatch.close(cancel_futures=False)
    assert dispatch.join(30)


def test_a_slot_that_dies_after_serving_a_backlog_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slot that took calls from a backlog counted itself idle after each,
    so the dispatcher believed in idle slots that did not exist: when the one
    slot then died (a strategy bug) with a call queued, no replacement
    started, and the call waited forever."""
    died: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    worker = _SlotsThatMayFail()
    dispatch: offload.strategy.Dispatcher[int] = offload.strategy.Dispatcher("backlog-test", 1, worker)
    release = threading.Event()
    first = _lane_call(release.wait, (30,))
    dispatch.put(first)
    deadline = time.monotonic() + 30
    while not dispatch.running():
        assert time.monotonic() < deadline
        time.sleep(0.005)
    backlog = [_lane_call(helpers.identity, (i,)) for i in range(5)]
    for call in backlog:
        dispatch.put(call)
    release.set()
    for call in [first, *backlog]:
        _ended(call)
    buggy = _lane_call(helpers.identity, ("bug",))
    dispatch.put(buggy)
    while not dispatch.running():
        assert time.monotonic() < deadline
        time.sleep(0.005)
    queued = _lane_call(helpers.identity, ("queued",))
    dispatch.put(queued)  # the one slot is busy: it waits
    worker.bug_may_raise.set()  # the slot dies; a fresh one must take `queued`
    _ended(buggy)
    _ended(queued)
    assert queued.outcome() == "queued"
    assert [type(e) for e in died] == [RuntimeError]
    dispatch.close(cancel_futures=False)
    assert dispatch.join(30)
