"""Scheduling by cost: the fair queue (`CallQueue`) on its own, then through
every queuing strategy on every backend: flows, lanes and weights, FIFO as a
choice, and admission by cost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import offload
from offload.strategy import Call, CallQueue, Flow, Lane

from . import faults, helpers
from .conftest import has_pool

prometheus_client = pytest.importorskip("prometheus_client")


def sample(name: str, **labels: str) -> float:
    return prometheus_client.REGISTRY.get_sample_value(name, labels) or 0.0


def make_call(tag: Any, cost: float = 1.0, flow: Flow | None = None, lane: Lane | None = None) -> Call[Any]:
    call: Call[Any] = Call(helpers.identity, (tag,), {})
    call.cost, call.flow, call.lane = cost, flow, lane
    return call


def drain(queue: CallQueue) -> list[Any]:
    order = []
    while (call := queue.pop()) is not None:
        order.append(call.args[0])
    return order


# ---- the queue on its own ------------------------------------------------------------


def test_equal_costs_and_no_flows_are_first_in_first_out() -> None:
    queue = CallQueue()
    for i in range(50):
        queue.push(make_call(i))
    assert drain(queue) == list(range(50))
    assert len(queue) == 0


def test_a_small_call_goes_ahead_of_another_flows_backlog() -> None:
    queue = CallQueue()
    heavy = Flow(Lane("default"))
    queue.push(make_call("running"))
    assert queue.pop() is not None  # a worker took it
    for i in range(8):
        queue.push(make_call(f"heavy-{i}", cost=100, flow=heavy))
    queue.push(make_call("small", cost=1))
    order = drain(queue)
    assert order[0] == "small"
    assert order[1:] == [f"heavy-{i}" for i in range(8)]  # a flow keeps its own order


def test_a_large_call_is_not_starved_by_a_stream_of_small_ones() -> None:
    queue = CallQueue()
    queue.push(make_call("large", cost=50))
    served = []
    for i in range(200):
        queue.push(make_call(i, cost=1))
        call = queue.pop()
        assert call is not None
        served.append(call.args[0])
        if served[-1] == "large":
            break
    assert "large" in served
    assert served.index("large") <= 51


def test_lanes_share_by_weight() -> None:
    fast, slow = Lane("fast", 3), Lane("slow", 1)
    queue = CallQueue()
    for i in range(100):
        queue.push(make_call(("fast", i), lane=fast))
        queue.push(make_call(("slow", i), lane=slow))
    first = drain(queue)[:40]
    fast_share = sum(1 for lane, _ in first if lane == "fast")
    assert 28 <= fast_share <= 32  # 3/4 of 40


def test_an_idle_lane_gets_no_credit_for_its_idle_time() -> None:
    busy, late = Lane("busy"), Lane("late")
    queue = CallQueue()
    for i in range(50):
        queue.push(make_call(("busy", i), lane=busy))
    for _ in range(40):
        assert queue.pop() is not None
    for i in range(20):
        queue.push(make_call(("late", i), lane=late))
    order = drain(queue)
    # Equal weights: they alternate from here on; the late lane does not get 40 in a row.
    assert [lane for lane, _ in order[:6]].count("late") <= 4


def test_withdrawn_calls_are_skipped_and_cost_nothing() -> None:
    queue = CallQueue()
    heavy = Flow(Lane("default"))
    withdrawn = [make_call(f"gone-{i}", cost=1000, flow=heavy) for i in range(5)]
    for call in withdrawn:
        queue.push(call)
        assert call.cancel()
    queue.push(make_call("kept", cost=1000, flow=heavy))
    queue.push(make_call("other", cost=1))
    assert drain(queue) == ["other", "kept"]


def test_take_removes_matching_calls_in_flow_order() -> None:
    queue = CallQueue()
    flow = Flow(Lane("default"))
    for i in range(6):
        queue.push(make_call(i, flow=flow if i % 2 else None))
    taken = queue.take(lambda call: call.args[0] % 2 == 1, 2)
    assert [call.args[0] for call in taken] == [1, 3]
    assert sorted(drain(queue)) == [0, 2, 4, 5]


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("push"),
            st.sampled_from([None, 0, 1, 2]),  # flow
            st.sampled_from([None, "a", "b"]),  # lane (of a call with no flow)
            st.sampled_from([0.0, 1.0, 3.0, 250.0]),  # cost
        ),
        st.tuples(st.just("pop")),
        st.tuples(st.just("cancel"), st.integers(0, 200)),
        st.tuples(st.just("take"), st.integers(0, 3)),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops)
def test_every_queued_call_leaves_once_in_its_flows_order(ops: list[tuple[Any, ...]]) -> None:
    lanes = {"a": Lane("a", 2), "b": Lane("b", 1)}
    flows = [Flow(lanes["a"]), Flow(lanes["b"]), Flow(Lane("default"))]
    queue = CallQueue()
    pushed: list[Call[Any]] = []
    left: list[Call[Any]] = []
    for op in ops:
        if op[0] == "push":
            _, flow, lane, cost = op
            call = make_call(len(pushed), cost, None if flow is None else flows[flow % 3],
                             None if lane is None else lanes[lane])
            pushed.append(call)
            queue.push(call)
        elif op[0] == "pop":
            call = queue.pop()
            if call is not None:
                assert call.claim()
                left.append(call)
        elif op[0] == "cancel" and pushed:
            pushed[op[1] % len(pushed)].cancel()
        elif op[0] == "take":
            for call in queue.take(lambda c: c.args[0] % 2 == 0, op[1]):
                assert call.claim()
                left.append(call)
    while (call := queue.pop()) is not None:
        assert call.claim()
        left.append(call)
    assert len(queue) == 0
    ids = [call.args[0] for call in left]
    assert len(ids) == len(set(ids)), "a call left the queue twice"
    pending = {call.args[0] for call in pushed if call.state != "cancelled"}
    assert set(ids) == pending, "a pending call never left, or a withdrawn one did"
    for flow in flows:
        mine = [call.args[0] for call in left if call.flow is flow]
        assert mine == sorted(mine), "a flow's calls left out of order"


@settings(max_examples=300, deadline=None)
@given(
    backlogs=st.lists(st.lists(st.sampled_from([1.0, 5.0, 40.0]), min_size=1, max_size=8), min_size=1, max_size=6),
    served=st.integers(0, 10),
)
def test_a_newcomer_waits_for_at_most_one_call_of_each_other_flow(
    backlogs: list[list[float]], served: int
) -> None:
    queue = CallQueue()
    lane = Lane("default")
    flows = [Flow(lane) for _ in backlogs]
    for flow, costs in zip(flows, backlogs, strict=True):
        for cost in costs:
            queue.push(make_call(flow, cost, flow))
    for _ in range(served):
        queue.pop()
    newcomer = make_call("new", 1.0)  # no other call costs less
    queue.push(newcomer)
    ahead: list[Any] = []
    while (call := queue.pop()) is not newcomer:
        assert call is not None
        ahead.append(call.args[0])
    assert all(ahead.count(flow) <= 1 for flow in flows), ahead


# ---- through the executor: every queuing strategy, every backend ---------------------

def one_worker(strategy: str, **options: Any) -> offload.Executor:
    if has_pool(strategy):
        options.setdefault("max_workers", 1)
    return offload.get_executor(strategy, **options)


async def occupy(ex: offload.Executor, tg: Any, tmp_path: Path) -> Path:
    """Start a call that holds the one worker until the returned gate file exists."""
    gate, started = tmp_path / "gate", tmp_path / "started"
    tg.start_soon(ex.run, faults.hold_until, str(gate), str(started))
    with anyio.fail_after(60):
        while not started.exists():  # noqa: ASYNC110 (a file another process writes)
            await anyio.sleep(0.005)
    return gate


async def queued(ex: offload.Executor, calls: int) -> None:
    assert ex._tracker is not None
    with anyio.fail_after(30):
        while ex._tracker.inflight < calls:  # noqa: ASYNC110 (a count worker threads change)
            await anyio.sleep(0.002)


def order(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()]


@pytest.mark.anyio
async def test_a_small_request_goes_ahead_of_a_heavy_requests_backlog(strategy: str, tmp_path: Path) -> None:
    if strategy == "inline":
        pytest.skip("inline has no queue")
    log = tmp_path / "order"
    ex = one_worker(strategy)
    try:
        async with anyio.create_task_group() as tg:
            gate = await occupy(ex, tg, tmp_path)

            async def heavy_request() -> None:
                with ex.admission("heavy", cost=800):
                    async with anyio.create_task_group() as pieces:
                        for i in range(1, 9):
                            pieces.start_soon(ex.options(cost=100).run, faults.record, str(log), i)

            tg.start_soon(heavy_request)
            await queued(ex, 1 + 1 + 8)  # the held call, the request's place, its pieces
            tg.start_soon(ex.options(cost=1).run, faults.record, str(log), 0)
            await queued(ex, 1 + 1 + 8 + 1)
            gate.touch()
        assert order(log)[0] == 0, order(log)
        assert sorted(order(log)[1:]) == list(range(1, 9))
    finally:
        await ex.aclose()


@pytest.mark.anyio
async def test_fifo_scheduling_keeps_arrival_order_whatever_the_cost(strategy: str, tmp_path: Path) -> None:
    if strategy == "inline":
        pytest.skip("inline has no queue")
    log = tmp_path / "order"
    ex = one_worker(strategy, scheduling="fifo")
    assert ex.scheduling == "fifo"
    try:
        async with anyio.create_task_group() as tg:
            gate = await occupy(ex, tg, tmp_path)
            for i in range(10):
                tg.start_soon(ex.options(cost=1000 if i % 2 else 1).run, faults.record, str(log), i)
                await queued(ex, 2 + i)
            gate.touch()
        assert order(log) == list(range(10))
    finally:
        await ex.aclose()


@pytest.mark.anyio
async def test_queued_cost_is_bounded_and_a_costlier_call_runs_alone(strategy: str, tmp_path: Path) -> None:
    if strategy == "inline":
        pytest.skip("inline has no queue")
    log = tmp_path / "order"
    ex = one_worker(strategy, max_queued_cost=10, lanes={"bulk": 1})
    refused_before = sample("offload_lane_rejected_total", strategy=strategy, lane="bulk", reason="overloaded")
    try:
        async with anyio.create_task_group() as tg:
            gate = await occupy(ex, tg, tmp_path)  # running: its cost is no longer queued
            bulk = ex.options(cost=4, lane="bulk")
            tg.start_soon(bulk.run, faults.record, str(log), 1)
            tg.start_soon(bulk.run, faults.record, str(log), 2)
            await queued(ex, 3)
            assert ex._tracker is not None
            assert ex._tracker.queued_cost == 8
            with pytest.raises(offload.Overloaded, match="max_queued_cost"):
                await bulk.run(faults.record, str(log), 3)  # 8 + 4 > 10: refused, never run
            small = ex.options(cost=1, lane="bulk").submit(faults.record, str(log), 4)  # 8 + 1 fits
            gate.touch()
        assert small.result(30) == 4
        assert sorted(order(log)) == [1, 2, 4]
        assert ex._tracker.queued_cost == 0
        # Nothing queued now: a call costlier than the whole bound is admitted and runs alone.
        assert await ex.options(cost=1000).run(helpers.add, 1, 2) == 3
        assert sample("offload_lane_rejected_total", strategy=strategy, lane="bulk", reason="overloaded") == (
            refused_before + 1
        )
    finally:
        await ex.aclose()
