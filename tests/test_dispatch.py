"""The slot dispatcher (`offload.strategy.Dispatcher`, under `thread` and
`process`; the `async-renderer` worker where it shares the rule): a call whose
worker thread cannot start fails and never runs, a slot that dies is replaced,
calls left without a slot fail, and shutdown ends while a call is in transit
between slots."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import offload

from . import helpers
from .in_subprocess import check, run_python

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
    pytest.importorskip("prometheus_client")  # the scenario reads the queued-calls gauge
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
    pytest.importorskip("prometheus_client")  # the scenario reads the queued-calls gauge
    code = THREAD_CANNOT_START.replace("sys.argv[1]", repr(strategy)).replace(
        "sys.argv[2]", repr("busy")
    ).replace("sys.argv[3]", repr(str(tmp_path)))
    out = check(run_python(code, timeout=120))
    assert "refused" not in out, out
    assert "queued call result True" in out, out
    assert "queued gauge 0.0" in out, out
    assert "shut down" in out, out


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
