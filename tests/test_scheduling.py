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
from offload.strategy import Call, CallQueue, Flow, Lane, Lanes

from . import faults, helpers
from .conftest import has_pool

prometheus_client = pytest.importorskip("prometheus_client")


def sample(name: str, **labels: str) -> float:
    return prometheus_client.REGISTRY.get_sample_value(name, labels) or 0.0


# The lane of the queue tests' calls that name none (an executor stamps its own).
PLAIN = Lane("default")


def make_call(tag: Any, cost: float = 1.0, flow: Flow | None = None, lane: Lane | None = None) -> Call[Any]:
    call: Call[Any] = Call(helpers.identity, (tag,), {})
    call.cost, call.flow = cost, flow
    call.lane = lane or (PLAIN if flow is None else flow.lane)
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
    heavy = Flow(PLAIN)
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
    heavy = Flow(PLAIN)
    withdrawn = [make_call(f"gone-{i}", cost=1000, flow=heavy) for i in range(5)]
    for call in withdrawn:
        queue.push(call)
        assert call.cancel()
    queue.push(make_call("kept", cost=1000, flow=heavy))
    queue.push(make_call("other", cost=1))
    assert drain(queue) == ["other", "kept"]


def test_take_removes_matching_calls_in_flow_order() -> None:
    queue = CallQueue()
    flow = Flow(PLAIN)
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
    flows = [Flow(lanes["a"]), Flow(lanes["b"]), Flow(PLAIN)]
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
    with anyio.fail_after(30):
        while ex.in_flight < calls:  # noqa: ASYNC110 (a count worker threads change)
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
            assert ex.queued_cost == 8
            with pytest.raises(offload.Overloaded, match="max_queued_cost"):
                await bulk.run(faults.record, str(log), 3)  # 8 + 4 > 10: refused, never run
            small = ex.options(cost=1, lane="bulk").submit(faults.record, str(log), 4)  # 8 + 1 fits
            gate.touch()
        assert small.result(30) == 4
        assert sorted(order(log)) == [1, 2, 4]
        assert ex.queued_cost == 0
        # Nothing queued now: a call costlier than the whole bound is admitted and runs alone.
        assert await ex.options(cost=1000).run(helpers.add, 1, 2) == 3
        assert sample("offload_lane_rejected_total", strategy=strategy, lane="bulk", reason="overloaded") == (
            refused_before + 1
        )
    finally:
        await ex.aclose()


def queuing_worker(strategy: str, **options: Any) -> offload.Executor:
    """One worker (one call at a time) for every queuing strategy."""
    if strategy == "inline":
        pytest.skip("inline has no queue")
    if strategy == "async-renderer":
        options.setdefault("max_batch_size", 1)
    return one_worker(strategy, **options)


@pytest.mark.anyio
async def test_queued_cost_returns_to_exactly_zero(strategy: str, tmp_path: Path) -> None:
    # 0.1 + 0.1 + 0.2 - 0.1 - 0.1 - 0.2 is 2.8e-17 in floats: an idle executor
    # that kept it would refuse a call costlier than the bound forever.
    ex = queuing_worker(strategy, max_queued_cost=1, lanes={"bulk": 1})
    log = tmp_path / "order"
    try:
        async with anyio.create_task_group() as tg:
            gate = await occupy(ex, tg, tmp_path)
            for i, cost in enumerate((0.1, 0.1, 0.2)):
                tg.start_soon(ex.options(cost=cost, lane="bulk").run, faults.record, str(log), i)
                await queued(ex, 2 + i)
            gate.touch()
        assert ex.queued_cost == 0.0
        assert ex.lane_queued_cost("bulk") == 0.0
        assert sample("offload_lane_queued_cost", strategy=strategy, lane="bulk") == 0.0
        assert await ex.options(cost=5, lane="bulk").run(helpers.add, 2, 3) == 5
    finally:
        await ex.aclose()


@pytest.mark.parametrize("first", ["bulk", "query"])
def test_virtual_time_restarts_when_the_queue_is_empty(first: str) -> None:
    query, bulk = Lane("query", 4), Lane("bulk", 1)
    queue = CallQueue()
    for i in range(2000):  # served one at a time: the queue empties after each
        queue.push(make_call(("query", i), lane=query))
        assert queue.pop() is not None
    late = [make_call(("bulk", i), lane=bulk) for i in range(300)]
    one = make_call(("query", "late"), lane=query)
    for call in ([*late, one] if first == "bulk" else [one, *late]):
        queue.push(call)
    order = drain(queue)
    # A fresh start: query (weight 4) goes first or second, never after 300 bulk calls.
    assert order.index(("query", "late")) <= 1, order[:5]


def test_a_lane_gets_no_credit_for_a_past_busy_period_either() -> None:
    a, b = Lane("a"), Lane("b")
    queue = CallQueue()
    for i in range(100):  # b is served alone, backlogged, then the queue empties
        queue.push(make_call(("b", i), lane=b))
    drain(queue)
    for i in range(10):
        queue.push(make_call(("b", i), lane=b))
        queue.push(make_call(("a", i), lane=a))
    lanes = [lane for lane, _ in drain(queue)]
    # Equal weights from a fresh start: they alternate (neither has 100 calls of credit or debt).
    assert lanes[:6].count("a") == 3, lanes


def test_a_flow_that_comes_back_after_idle_starts_from_the_lane_clock() -> None:
    lane = Lane("default")
    old, new = Flow(lane), Flow(lane)
    queue = CallQueue()
    for i in range(100):  # a long history, served one at a time
        queue.push(make_call(("old", i), cost=10, flow=old))
        assert queue.pop() is not None
    for i in range(3):
        queue.push(make_call(("new", i), cost=10, flow=new))
    queue.push(make_call(("old", "late"), cost=10, flow=old))
    order = drain(queue)
    assert order.index(("old", "late")) <= 1, order


@pytest.mark.anyio
async def test_a_lane_busy_before_an_idle_spell_is_not_held_back_after_it(strategy: str, tmp_path: Path) -> None:
    ex = queuing_worker(strategy, lanes={"query": 4, "bulk": 1})
    log = tmp_path / "order"
    try:
        query = ex.options(lane="query")
        for _ in range(200):  # one at a time: the queue goes idle after each
            assert await query.run(helpers.add, 1, 1) == 2
        async with anyio.create_task_group() as tg:
            gate = await occupy(ex, tg, tmp_path)
            for i in range(30):
                tg.start_soon(ex.options(lane="bulk").run, faults.record, str(log), 100 + i)
            await queued(ex, 1 + 30)
            tg.start_soon(query.run, faults.record, str(log), 0)
            await queued(ex, 1 + 31)
            gate.touch()
        assert order(log).index(0) <= 1, order(log)
    finally:
        await ex.aclose()


@pytest.mark.anyio
async def test_each_lane_is_admitted_up_to_its_share_of_the_cost_bound(strategy: str, tmp_path: Path) -> None:
    # Weights 4 + 1 + 1 (default): shares of 12 are 8, 2 and 2.
    ex = queuing_worker(strategy, max_queued_cost=12, lanes={"query": 4, "bulk": 1})
    log = tmp_path / "order"
    refused = {
        lane: sample("offload_lane_rejected_total", strategy=strategy, lane=lane, reason="overloaded")
        for lane in ("query", "bulk")
    }
    try:
        async with anyio.create_task_group() as tg:
            gate = await occupy(ex, tg, tmp_path)
            bulk, query = ex.options(lane="bulk"), ex.options(lane="query")
            # bulk borrows the whole bound
            futures = [bulk.submit(faults.record, str(log), 100 + i) for i in range(12)]
            with pytest.raises(offload.Overloaded, match="max_queued_cost"):
                bulk.submit(faults.record, str(log), 199)
            # query is still admitted up to its own share
            futures += [query.submit(faults.record, str(log), i) for i in range(8)]
            with pytest.raises(offload.Overloaded, match="lane 'query' has 8 of its share 8"):
                query.submit(faults.record, str(log), 99)
            assert ex.would_refuse(lane="query")
            assert ex.would_refuse(lane="bulk", cost=0.5)
            assert not ex.would_refuse(lane="default", cost=2)  # its share is untouched
            # what must drain first: the smaller of the total's and the lane's excess
            assert ex.cost_to_admit(lane="query") == 1  # its share: 8 + 1 - 8
            assert ex.cost_to_admit(lane="bulk", cost=0.5) == 8.5  # the total: 20 + 0.5 - 12
            assert ex.cost_to_admit(lane="default", cost=2) == 0
            with pytest.raises(offload.ConfigError, match="unknown lane 'nope'"):
                ex.would_refuse(lane="nope")
            gate.touch()
        for future in futures:
            assert future.result(30) is not None
        assert sorted(order(log)) == [*range(8), *range(100, 112)]
        for lane in ("query", "bulk"):
            assert sample(
                "offload_lane_rejected_total", strategy=strategy, lane=lane, reason="overloaded"
            ) == refused[lane] + 1
        assert ex.queued_cost == 0.0
    finally:
        await ex.aclose()


@pytest.mark.anyio
async def test_each_lane_is_admitted_up_to_its_share_of_max_queue(strategy: str, tmp_path: Path) -> None:
    probe = queuing_worker(strategy)
    capacity = probe.capacity
    probe.shutdown()
    assert capacity == 1
    # capacity 1 + max_queue 5 = 6 places; weights 4 + 1 + 1: shares 4, 1, 1.
    ex = queuing_worker(strategy, max_queue=5, lanes={"query": 4, "bulk": 1})
    log = tmp_path / "order"
    try:
        async with anyio.create_task_group() as tg:
            gate = await occupy(ex, tg, tmp_path)  # the default lane's place
            bulk, query = ex.options(lane="bulk"), ex.options(lane="query")
            futures = [bulk.submit(faults.record, str(log), 100 + i) for i in range(5)]
            with pytest.raises(offload.Overloaded, match="max_queue=5"):
                bulk.submit(faults.record, str(log), 199)
            assert ex.overloaded  # the default lane holds its one place already
            futures += [query.submit(faults.record, str(log), i) for i in range(4)]
            with pytest.raises(offload.Overloaded, match="lane 'query' has 4 of its share 4"):
                query.submit(faults.record, str(log), 99)
            gate.touch()
        for future in futures:
            assert future.result(30) is not None
        assert sorted(order(log)) == [*range(4), *range(100, 105)]
    finally:
        await ex.aclose()


@pytest.mark.anyio
async def test_a_unit_larger_than_the_bound_holds_it_only_until_that_much_is_queued(
    strategy: str, tmp_path: Path
) -> None:
    ex = queuing_worker(strategy, max_queued_cost=10)
    held, spent, go_on, done = anyio.Event(), anyio.Event(), anyio.Event(), anyio.Event()

    async def huge_request() -> None:
        with ex.admission("huge", cost=1000):
            held.set()
            await go_on.wait()
            for i in range(10):  # its pieces take the held cost over, then run
                assert await ex.options(cost=1).run(helpers.add, i, 0) == i
            spent.set()
            await done.wait()
            for i in range(10):  # and it is never refused halfway
                assert await ex.options(cost=1).run(helpers.add, i, 1) == i + 1

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(huge_request)
            await held.wait()
            assert ex.overloaded  # it holds the bound: a burst cannot all pass
            with pytest.raises(offload.Overloaded, match="max_queued_cost"):
                await ex.options(cost=1).run(helpers.add, 1, 1)
            go_on.set()
            await spent.wait()
            # Its held cost is spent: others are admitted while it goes on.
            assert not ex.overloaded
            assert await ex.options(cost=5).run(helpers.add, 2, 3) == 5
            done.set()
        assert ex.queued_cost == 0.0
        assert ex.in_flight == 0
    finally:
        await ex.aclose()


@pytest.mark.parametrize("weight", [1e-320, 5e-324, 1e-12, 1e300, 1e12])
def test_a_weight_whose_inverse_is_not_sane_is_a_config_error(weight: float) -> None:
    with pytest.raises(offload.ConfigError, match=r"lane 'tiny': the weight must be a number from 1e-09 to 1e\+09"):
        Lane("tiny", weight)
    with pytest.raises(offload.ConfigError, match="lane 'tiny': the weight must be"):
        offload.get_executor("thread", lanes={"tiny": weight})


def test_a_withdrawn_call_does_not_advance_its_flows_finish() -> None:
    lane = Lane("default")
    mine, other = Flow(lane), Flow(lane)
    queue = CallQueue()
    gone = make_call("gone", cost=1000, flow=mine)
    for call in (make_call("m1", cost=1, flow=mine), gone, make_call("m3", cost=1, flow=mine)):
        queue.push(call)
    for i in range(20):
        queue.push(make_call(("other", i), cost=10, flow=other))
    assert gone.cancel()
    # m3 is stamped as if "gone" had never been queued: 1 + 1, ahead of the other flow's 10.
    assert drain(queue)[:2] == ["m1", "m3"]
    assert len(queue) == 0


def test_a_withdrawn_head_does_not_advance_its_flows_finish() -> None:
    lane = Lane("default")
    mine, newcomer = Flow(lane), Flow(lane)
    queue = CallQueue()
    gone = make_call("gone", cost=1000, flow=mine)
    queue.push(gone)
    for i in range(3):
        queue.push(make_call(("mine", i), cost=10, flow=mine))
    assert gone.cancel()
    assert queue.pop().args[0] == ("mine", 0)  # type: ignore[union-attr]
    for i in range(3):
        queue.push(make_call(("new", i), cost=10, flow=newcomer))
    # Mine goes on from where "gone" would have started, not 1000 later: they interleave.
    order = drain(queue)
    assert order.index(("mine", 1)) <= 1, order


# None: no call before; else one call that cheap first (it used to make zero cost free).
@pytest.mark.parametrize("cheap_first", [None, 1e-300, 5e-324, 1e-9])
def test_a_lane_of_zero_cost_calls_does_not_get_strict_priority(cheap_first: float | None) -> None:
    free, paid = Lane("free"), Lane("paid")
    queue = CallQueue()
    if cheap_first is not None:
        queue.push(make_call("cheap", cost=cheap_first))
        assert queue.pop() is not None
    for i in range(10):
        queue.push(make_call(("paid", i), cost=1, lane=paid))
    served = []
    for i in range(40):  # a steady stream of zero-cost calls
        queue.push(make_call(("free", i), cost=0, lane=free))
        call = queue.pop()
        assert call is not None
        served.append(call.args[0][0])
    # Equal weights: zero cost counts about as the positive costs seen (1), so they alternate.
    assert 7 <= served[:20].count("paid") <= 13, served


def test_a_flow_of_zero_cost_calls_does_not_get_strict_priority() -> None:
    lane = Lane("default")
    free, paid = Flow(lane), Flow(lane)
    queue = CallQueue()
    for i in range(10):
        queue.push(make_call(("paid", i), cost=2, flow=paid))
    served = []
    for i in range(40):
        queue.push(make_call(("free", i), cost=0, flow=free))
        call = queue.pop()
        assert call is not None
        served.append(call.args[0][0])
    # Zero cost counts as the positive costs seen (2): they alternate.
    assert 8 <= served[:20].count("paid") <= 12, served


def test_take_serves_the_lanes_by_weight_and_charges_them() -> None:
    bulk, query = Lane("bulk", 1), Lane("query", 4)
    queue = CallQueue()
    for i in range(80):
        queue.push(make_call(("bulk", i), lane=bulk))
    for i in range(80):
        queue.push(make_call(("query", i), lane=query))
    head = queue.pop()
    assert head is not None
    batch = [head.args[0], *(call.args[0] for call in queue.take(lambda call: True, 79))]
    assert 60 <= [lane for lane, _ in batch].count("query") <= 68, batch  # 4/5 of 80
    # Charged: the next batch goes on from there, it does not repeat the first one's lanes.
    rest = [lane for lane, _ in drain(queue)]
    assert rest[:20].count("query") <= 16, rest[:20]


@settings(max_examples=300, deadline=None)
@given(
    weights=st.tuples(st.sampled_from([1.0, 2.0, 3.0, 0.5]), st.sampled_from([1.0, 4.0, 0.25])),
    costs=st.lists(st.tuples(st.sampled_from([1.0, 2.5, 7.0, 10.0]), st.sampled_from([1.0, 2.5, 7.0, 10.0])),
                   min_size=5, max_size=60),
    steps=st.lists(st.integers(0, 6), min_size=1, max_size=40),
    flows=st.booleans(),
)
def test_two_backlogged_lanes_get_weighted_shares_within_one_call(
    weights: tuple[float, float], costs: list[tuple[float, float]], steps: list[int], flows: bool
) -> None:
    """Served one by one (`pop`, step 0) or in batches (`take`, step k: k
    calls), while both lanes are backlogged, each lane's served cost over its
    weight stays within a call's cost (over the smaller weight) of the other's."""
    lanes = (Lane("a", weights[0]), Lane("b", weights[1]))
    queue = CallQueue()
    for pair in costs:
        for lane, cost in zip(lanes, pair, strict=True):
            queue.push(make_call(lane.name, cost, Flow(lane) if flows else None, lane))
    served = {"a": 0.0, "b": 0.0}
    left = {"a": len(costs), "b": len(costs)}
    bound = 10.0 / weights[0] + 10.0 / weights[1]
    for step in steps:
        got = [queue.pop()] if step == 0 else queue.take(lambda call: True, step)
        for call in got:
            assert call is not None
            served[call.args[0]] += call.cost
            left[call.args[0]] -= 1
        if min(left.values()) == 0:
            break
        assert abs(served["a"] / weights[0] - served["b"] / weights[1]) <= bound, served


@settings(max_examples=300, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["admit", "start", "withdraw"]),
            st.sampled_from(["default", "query", "bulk"]),
            st.sampled_from([0.0, 0.1, 0.2, 0.3, 1 / 3, 0.7, 2.5, 40.0]),
        ),
        max_size=80,
    )
)
def test_admission_by_lane_share_is_exact(ops: list[tuple[str, str, float]]) -> None:
    """The per-lane rule exactly: admitted when the total stays within the
    bound or the lane within its share; never refused otherwise; the queued
    cost returns to exactly 0 once every call has left."""
    from offload._admission import Limiter, Limits

    weights = {"default": 1.0, "query": 4.0, "bulk": 1.0}
    lanes = Lanes(weights)
    tracker = Limiter("thread", lanes, Limits(1, None, 3.0))
    share = {name: 3.0 * weight / 6.0 for name, weight in weights.items()}
    queued: list[Call[Any]] = []
    for op, lane, cost in ops:
        if op == "admit":
            call = make_call(lane, cost, lane=lanes[lane])
            total, mine = tracker.queued_cost, tracker.lane_queued_cost(lanes[lane])
            fits = total + cost <= 3.0 + 1e-9 or mine + min(cost, share[lane]) <= share[lane] + 1e-9
            fits_surely = total + cost <= 3.0 - 1e-9 or mine + min(cost, share[lane]) <= share[lane] - 1e-9
            try:
                tracker.admit(call)
            except offload.Overloaded:
                assert not fits_surely, (total, mine, cost)
            else:
                assert fits, (total, mine, cost)
                queued.append(call)
        elif queued:
            call = queued.pop(0)
            if op == "start":
                call.started_at = call.queued_at
                tracker.started(call)
                tracker.finished(call)
            else:
                tracker.withdrawn(call, "cancelled")
    for call in queued:
        tracker.withdrawn(call, "cancelled")
    assert tracker.queued_cost == 0.0
    assert all(tracker.lane_queued_cost(lane) == 0.0 for lane in lanes.values())
    assert tracker.inflight == 0
