"""`StrategyContract`: the rules every strategy obeys, as pytest tests."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import importlib.util
import math
import os
import signal
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, cast

import anyio
import anyio.lowlevel
import pytest

import offload

from .._registry import _registry, option_names
from . import _functions as f


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: set to None in sys.modules (blocked)
        return False


_HAS = {name: _installed(name) for name in ("trio", "uvloop", "hypothesis")}

#: The event loops the suite runs on: asyncio always, uvloop and trio where installed.
BACKENDS = [
    pytest.param(("asyncio", {}), id="asyncio"),
    *([pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")] if _HAS["uvloop"] else []),
    *([pytest.param(("trio", {}), id="trio")] if _HAS["trio"] else []),
]
_BACKEND_NAMES = ["asyncio", *(["trio"] if _HAS["trio"] else [])]

# Values of every kind pickle carries (a strategy may send them to another process).
_EXAMPLES: list[tuple[list[Any], dict[str, Any]]] = [
    ([], {}),
    ([None, True, 0, -(2**70), 1.5, "", "é", b"\x00\xff"], {}),
    ([[1, [2, (3, None)]], (1, "x")], {"a": {"k": [b"v", -0.0]}, "b": ()}),
    ([{"": {"nested": (True, 2.5e300)}}], {"c": "text" * 5}),
]
_MESSAGES = ["boom", "", "multi\nline é"]


def _with_values(test: Callable[..., None]) -> Callable[..., None]:
    """Drive `test(..., args, kwargs)` with Hypothesis where it is installed,
    else with a fixed set of examples."""
    if _HAS["hypothesis"]:
        from hypothesis import HealthCheck, given, settings
        from hypothesis import strategies as st

        scalars: Any = st.none() | st.booleans() | st.integers() | st.text(max_size=20) | st.binary(max_size=32)
        scalars |= st.floats(allow_nan=False)
        values = st.recursive(
            scalars,
            lambda inner: st.lists(inner, max_size=4)
            | st.tuples(inner, inner)
            | st.dictionaries(st.text(max_size=5), inner, max_size=4),
            max_leaves=12,
        )
        driven: Any = settings(
            max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
        )(
            given(
                args=st.lists(values, max_size=3),
                kwargs=st.dictionaries(st.sampled_from("abc"), values, max_size=3),
            )(test)
        )
        return cast("Callable[..., None]", driven)
    marked: Callable[..., None] = pytest.mark.parametrize(("args", "kwargs"), _EXAMPLES)(test)
    return marked


def _with_messages(test: Callable[..., None]) -> Callable[..., None]:
    if _HAS["hypothesis"]:
        from hypothesis import HealthCheck, given, settings
        from hypothesis import strategies as st

        driven: Any = settings(
            max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
        )(given(message=st.text(max_size=40))(test))
        return cast("Callable[..., None]", driven)
    marked: Callable[..., None] = pytest.mark.parametrize("message", _MESSAGES)(test)
    return marked


def _normalise(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, *(_normalise(v) for v in value)]
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items()}
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


def _sample(name: str, **labels: str) -> float | None:
    """A Prometheus sample, or `None` when metrics are off (no `prometheus_client`)."""
    from offload._metrics import metrics_enabled

    if not metrics_enabled():
        return None
    import prometheus_client

    return prometheus_client.REGISTRY.get_sample_value(name, labels) or 0.0


def _inflight(ex: offload.Executor) -> int:
    """Calls admitted and not yet ended (running, queued, or holding an admitted place)."""
    return ex.in_flight


def _overloaded(ex: offload.Executor) -> bool:
    # A call, not the property: its value changes between two reads.
    return ex.overloaded


async def _wait_until(predicate: Callable[[], bool], seconds: float = 30.0) -> None:
    with anyio.fail_after(seconds):
        while not predicate():  # noqa: ASYNC110 (a state other threads and processes change)
            await anyio.sleep(0.005)


def _markers(path: Path) -> int:
    return path.read_text().count("ran") if path.exists() else 0


def _order(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()]


async def _peak_concurrency(ex: offload.Executor, directory: Path, calls: int, hold: float) -> int:
    seen: list[int] = []

    async def one() -> None:
        seen.append(await ex.run(f.hold_slot, str(directory), hold))

    async with anyio.create_task_group() as tg:
        for _ in range(calls):
            tg.start_soon(one)
    return max(seen)


_var: contextvars.ContextVar[str] = contextvars.ContextVar("offload_testing_var", default="unset")


def _read_var() -> str:
    value = _var.get()
    _var.set("changed-in-worker")
    return value


def _where() -> tuple[int, int]:
    return os.getpid(), threading.get_ident()


class StrategyContract:
    """The contract suite: subclass it in a test module, name the strategy, run pytest.

        from offload.testing import StrategyContract

        class TestPool(StrategyContract):
            strategy_name = "pool"

    The strategy must be registered under that name (an entry point in the
    group `offload.strategies`; `pip install -e .` of the plugin does it).
    Each test builds its own executors (`offload.get_executor(name,
    **options)`) and runs on asyncio, and on uvloop and trio where installed.

    The tests skip by what a strategy declares or does, never by its name:
    no queue (`capacity()` is `None`): no cancellation of queued calls, no
    `max_queue`, no lanes; calls that run on the caller's thread: no
    cancellation or timeout of a running call; `carries_context = False`: no
    `contextvars`, no local functions; `replaces_crashed_workers = True`: a
    worker killed mid-call fails that call with `WorkerCrashed` and the next
    call runs. Metrics are checked where `prometheus_client` is installed;
    Hypothesis drives the value tests where installed (else fixed examples).
    Functions the tests run live in `offload.testing._functions`, importable
    by name in a worker process.
    """

    #: The registered name of the strategy under test.
    strategy_name: ClassVar[str]

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.anyio]

    @pytest.fixture(params=BACKENDS)
    def anyio_backend(self, request: pytest.FixtureRequest) -> Any:
        return request.param

    @pytest.fixture
    def strategy(self) -> str:
        """The strategy under test (override to parametrize over several)."""
        return self.strategy_name

    def strategy_options(self, strategy: str) -> dict[str, Any]:
        """Options for every executor the suite builds, such that `capacity()`
        calls of a plain function run at once. Default: `max_workers=2` if the
        strategy takes `max_workers`, else none; override to add your own."""
        return {"max_workers": 2} if self._takes(strategy, "max_workers") else {}

    @staticmethod
    def _takes(strategy: str, option: str) -> bool:
        return option in option_names(_registry.get(strategy))

    def new_executor(self, strategy: str, **extra: Any) -> offload.Executor:
        """An executor for `strategy` with `strategy_options` and `extra`
        (`max_workers` in `extra` is dropped for a strategy without it)."""
        options = self.strategy_options(strategy)
        for key, value in extra.items():
            if key == "max_workers" and not self._takes(strategy, key):
                continue
            options[key] = value
        return offload.get_executor(strategy, **options)

    @pytest.fixture
    def executor(self, strategy: str) -> Iterator[offload.Executor]:
        ex = self.new_executor(strategy)
        try:
            yield ex
        finally:
            ex.shutdown(wait=True, cancel_futures=True)

    @pytest.fixture
    def sync_executor(self, strategy: str) -> Iterator[offload.Executor]:
        ex = self.new_executor(strategy)
        try:
            yield ex
        finally:
            ex.shutdown(wait=True, cancel_futures=True)

    @staticmethod
    def _needs_queue(ex: offload.Executor) -> int:
        if ex.capacity is None:
            pytest.skip(f"{ex.name} has no queue (capacity() is None): every call starts at once")
        return ex.capacity

    @staticmethod
    async def _skip_if_on_callers_thread(ex: offload.Executor) -> None:
        if await ex.run(_where) == _where():
            pytest.skip(f"{ex.name} runs calls on the caller's thread: nothing can stop one mid-call")

    # ---- results and errors ----------------------------------------------------------

    async def test_run_returns_result(self, executor: offload.Executor) -> None:
        assert await executor.run(f.add, 2, b=3) == 5
        assert await executor.run(f.echo_args, 1, "x", k=[1, 2]) == ((1, "x"), {"k": [1, 2]})

    async def test_exception_type_message_and_frames(self, executor: offload.Executor) -> None:
        with pytest.raises(f.CustomError, match="^boom$") as info:
            await executor.run(f.raise_custom, "boom")
        text = "".join(traceback.format_exception(info.value))
        assert "raise_custom" in text
        assert "_functions.py" in text

    async def test_many_concurrent_calls_each_get_their_own_result(self, executor: offload.Executor) -> None:
        results: dict[int, int] = {}

        async def one(i: int) -> None:
            results[i] = await executor.run(f.add, i, b=1000)

        async with anyio.create_task_group() as tg:
            for i in range(200):
                tg.start_soon(one, i)
        assert results == {i: i + 1000 for i in range(200)}

    async def test_submit_and_map(self, executor: offload.Executor) -> None:
        future = executor.submit(f.add, 1, b=2)
        assert await anyio.to_thread.run_sync(future.result, 30) == 3
        assert list(executor.map(f.add, [1, 2, 3], [10, 20, 30])) == [11, 22, 33]
        failing = executor.submit(f.raise_value_error, "nope")
        with pytest.raises(ValueError, match="nope"):
            await anyio.to_thread.run_sync(failing.result, 30)

    @pytest.mark.parametrize("anyio_backend", ["asyncio"])
    async def test_drops_into_run_in_executor(self, executor: offload.Executor) -> None:
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(executor, f.add, 40, 2) == 42

    @pytest.mark.parametrize("backend", _BACKEND_NAMES)
    @_with_values
    def test_same_result_as_a_direct_call(
        self, sync_executor: offload.Executor, backend: str, args: list[Any], kwargs: dict[str, Any]
    ) -> None:
        async def go() -> Any:
            return await sync_executor.run(f.echo_args, *args, **kwargs)

        result = anyio.run(go, backend=backend)
        assert _normalise(result) == _normalise(f.echo_args(*args, **kwargs))

    @pytest.mark.parametrize("kind", ["custom", "value"])
    @_with_messages
    def test_exceptions_are_identical(self, sync_executor: offload.Executor, kind: str, message: str) -> None:
        fn = f.raise_custom if kind == "custom" else f.raise_value_error

        async def go() -> BaseException:
            try:
                await sync_executor.run(fn, message)
            except BaseException as exc:
                return exc
            raise AssertionError("no exception")

        exc = anyio.run(go)
        assert type(exc) is (f.CustomError if kind == "custom" else ValueError)
        assert exc.args == (message,)

    @pytest.mark.parametrize("backend", _BACKEND_NAMES)
    def test_thousand_concurrent_callers_get_their_own_results(
        self, sync_executor: offload.Executor, backend: str
    ) -> None:
        async def go() -> dict[int, Any]:
            results: dict[int, Any] = {}

            async def one(i: int) -> None:
                results[i] = await sync_executor.run(f.identity, (i, str(i)))

            async with anyio.create_task_group() as tg:
                for i in range(1000):
                    tg.start_soon(one, i)
            return results

        assert anyio.run(go, backend=backend) == {i: (i, str(i)) for i in range(1000)}

    async def test_executor_works_across_event_loops(self, executor: offload.Executor) -> None:
        """An executor made at import time serves whatever loop calls it."""
        assert await executor.run(f.add, 1, 1) == 2
        other = _BACKEND_NAMES[-1]
        result = await anyio.to_thread.run_sync(lambda: anyio.run(executor.run, f.add, 2, 2, backend=other))
        assert result == 4

    # ---- make_async ------------------------------------------------------------------

    async def test_make_async_decorator_with_options(self, strategy: str) -> None:
        options = {**self.strategy_options(strategy)}

        @offload.make_async(strategy=strategy, **options)
        def double(x: int) -> int:
            return x * 2

        try:
            assert double.executor.name == strategy  # type: ignore[attr-defined]
            if double.executor.carries_context:  # type: ignore[attr-defined]
                # A local function runs where calls run in this process.
                assert await double(21) == 42
        finally:
            await double.executor.aclose()  # type: ignore[attr-defined]

    async def test_a_function_make_async_decorated_runs(self, executor: offload.Executor) -> None:
        # What `make_async` sends to the executor is the function it wrapped,
        # whose module-level name is now the wrapper's.
        original = f.decorated_double.__wrapped__  # type: ignore[attr-defined]
        assert await executor.run(original, 21) == 42

    async def test_make_async_call_form(self, strategy: str) -> None:
        wrapped = offload.make_async(f.add, strategy=strategy, **self.strategy_options(strategy))
        try:
            assert await wrapped(1, b=2) == 3
        finally:
            await wrapped.executor.aclose()  # type: ignore[attr-defined]

    # ---- context and worker state -----------------------------------------------------

    async def test_contextvars_are_copied_into_the_worker(self, executor: offload.Executor) -> None:
        if not executor.carries_context:
            pytest.skip(f"{executor.name} does not carry contextvars (carries_context = False)")
        token = _var.set("from-caller")
        try:
            assert await executor.run(_read_var) == "from-caller"
            assert _var.get() == "from-caller"  # the worker's change stays in its copy
        finally:
            _var.reset(token)

    async def test_initializer_builds_one_state_per_worker(self, strategy: str) -> None:
        ex = self.new_executor(strategy, initializer=f.make_state, initargs=("T",))
        states = []
        try:
            async with anyio.create_task_group() as tg:

                async def one() -> None:
                    states.append(await ex.run(f.read_state))

                for _ in range(40):
                    tg.start_soon(one)
        finally:
            await ex.aclose()
        assert all(s["tag"] == "T" for s in states)
        # Each worker has its own state object: calls per worker add up to the total.
        workers: dict[tuple[int, int], int] = {}
        for s in states:
            key = (s["pid"], s["thread"])
            workers[key] = max(workers.get(key, 0), s["calls"])
        assert sum(workers.values()) == 40

    # ---- cancellation ----------------------------------------------------------------

    async def test_cancelled_call_that_has_not_started_never_runs(self, strategy: str, tmp_path: Path) -> None:
        ex = self.new_executor(strategy, max_workers=1)
        try:
            capacity = self._needs_queue(ex)
            blockers = [tmp_path / f"blocker{i}" for i in range(capacity)]
            queued = tmp_path / "queued"
            async with anyio.create_task_group() as tg:
                for blocker in blockers:
                    tg.start_soon(ex.run, f.write_marker, str(blocker), 0.5)
                await anyio.sleep(0.1)
                with anyio.CancelScope() as scope:
                    scope.cancel()
                    await ex.run(f.write_marker, str(queued))
            await anyio.sleep(0.3)
            assert [_markers(b) for b in blockers] == [1] * capacity
            assert _markers(queued) == 0
            assert await ex.run(f.add, 1, 2) == 3
        finally:
            await ex.aclose()

    async def test_cancelling_a_running_call_returns_at_once_and_it_finishes(
        self, strategy: str, tmp_path: Path
    ) -> None:
        ex = self.new_executor(strategy)
        try:
            await self._skip_if_on_callers_thread(ex)  # also brings a worker up
            marker = tmp_path / "m"
            with anyio.move_on_after(0.3) as scope:
                await ex.run(f.write_marker, str(marker), 1.0)
            assert scope.cancelled_caught
            assert _markers(marker) == 0  # returned before the call finished
            with anyio.fail_after(30):
                while _markers(marker) == 0:  # noqa: ASYNC110 (a file another process writes)
                    await anyio.sleep(0.05)
        finally:
            await ex.aclose()

    async def test_queued_calls_cancelled_concurrently_never_run(self, strategy: str, tmp_path: Path) -> None:
        ex = self.new_executor(strategy, max_workers=1)
        try:
            capacity = self._needs_queue(ex)
            mask = [i % 3 != 1 for i in range(8)]
            async with anyio.create_task_group() as tg:
                for _ in range(capacity):
                    tg.start_soon(ex.run, f.sleep_and_return, 0.2)
                await anyio.sleep(0.05)
                scopes = []
                for i, cancel in enumerate(mask):
                    scope = anyio.CancelScope()
                    scopes.append((scope, cancel))

                    async def one(i: int = i, scope: anyio.CancelScope = scope) -> None:
                        with scope:
                            await ex.run(f.write_marker, str(tmp_path / f"{i}"))

                    tg.start_soon(one)
                await anyio.lowlevel.checkpoint()
                for scope, cancel in scopes:
                    if cancel:
                        scope.cancel()
        finally:
            await ex.aclose()
        ran = {int(p.name) for p in tmp_path.iterdir()}  # noqa: ASYNC240 (the calls are over)
        assert ran == {i for i, cancel in enumerate(mask) if not cancel}

    # ---- the concurrency bound and lanes ---------------------------------------------

    async def test_concurrency_bound_holds(self, strategy: str, tmp_path: Path) -> None:
        ex = self.new_executor(strategy)
        try:
            capacity = self._needs_queue(ex)
            peak = await _peak_concurrency(ex, tmp_path, calls=12, hold=0.05)
        finally:
            await ex.aclose()
        assert 1 <= peak <= capacity

    async def _occupy(self, ex: offload.Executor, tg: Any, tmp_path: Path) -> Path:
        """Start calls that hold every worker until the returned gate file exists."""
        gate = tmp_path / "gate"
        started = [tmp_path / f"started{i}" for i in range(ex.capacity or 1)]
        for path in started:
            tg.start_soon(ex.run, f.hold_until, str(gate), str(path))
        await _wait_until(lambda: all(p.exists() for p in started), 60)
        return gate

    async def test_lanes_share_the_workers_by_weight(self, strategy: str, tmp_path: Path) -> None:
        ex = self.new_executor(strategy, max_workers=1, lanes={"query": 3, "ingest": 1})
        log = tmp_path / "order"
        try:
            capacity = self._needs_queue(ex)
            async with anyio.create_task_group() as tg:
                gate = await self._occupy(ex, tg, tmp_path)
                query, ingest = ex.options(lane="query"), ex.options(lane="ingest")
                for i in range(24):
                    tg.start_soon(ingest.run, f.record, str(log), 100 + i)
                    tg.start_soon(query.run, f.record, str(log), i)
                await _wait_until(lambda: _inflight(ex) == capacity + 48)
                gate.touch()
            first = _order(log)[:16]
            assert 10 <= sum(1 for i in first if i < 100) <= 14, first  # 3/4 of 16
        finally:
            await ex.aclose()

    async def test_the_default_lanes_weight_holds_for_calls_that_name_no_lane(
        self, strategy: str, tmp_path: Path
    ) -> None:
        ex = self.new_executor(strategy, max_workers=1, lanes={"default": 4, "bulk": 1})
        log = tmp_path / "order"
        try:
            capacity = self._needs_queue(ex)
            async with anyio.create_task_group() as tg:
                gate = await self._occupy(ex, tg, tmp_path)
                bulk = ex.options(lane="bulk")
                for i in range(25):
                    tg.start_soon(bulk.run, f.record, str(log), 100 + i)
                    tg.start_soon(ex.run, f.record, str(log), i)  # no lane: the default one
                await _wait_until(lambda: _inflight(ex) == capacity + 50)
                gate.touch()
            first = _order(log)[:20]
            # 4/5 of 20 is 16; weight 1 (the default lane's weight ignored) gives 10.
            assert 14 <= sum(1 for i in first if i < 100) <= 18, first
        finally:
            await ex.aclose()

    # ---- admission: max_queue --------------------------------------------------------

    async def test_max_queue_refuses_excess_at_once_and_runs_nothing_for_it(
        self, strategy: str, tmp_path: Path
    ) -> None:
        max_queue = 3
        ex = self.new_executor(strategy, max_queue=max_queue) if self._queues(strategy) else None
        if ex is None:
            pytest.skip(f"{strategy} has no queue (capacity() is None): max_queue does not apply")
        capacity = self._needs_queue(ex)
        assert ex.max_queue == max_queue
        gate = str(tmp_path / "gate")
        labels = {"strategy": strategy, "function": f"{f.__name__}.gated", "reason": "overloaded"}
        rejected_before = _sample("offload_rejected_calls_total", **labels)
        results: list[str] = []
        try:
            async with anyio.create_task_group() as tg:

                async def one(tag: str) -> None:
                    results.append(await ex.run(f.gated, gate, str(tmp_path), tag))

                for i in range(capacity + max_queue):
                    tg.start_soon(one, f"ok{i}")
                await _wait_until(lambda: ex.overloaded)
                assert _inflight(ex) == capacity + max_queue
                with pytest.raises(offload.Overloaded, match="max_queue=3"):
                    await ex.run(f.gated, gate, str(tmp_path), "refused")
                with pytest.raises(offload.Overloaded):
                    ex.submit(f.gated, gate, str(tmp_path), "refused-too")
                await anyio.Path(gate).touch()
            assert sorted(results) == sorted(f"ok{i}" for i in range(capacity + max_queue))
            assert not (tmp_path / "refused").exists()
            assert not (tmp_path / "refused-too").exists()
            assert await ex.run(f.add, 1, b=2) == 3  # the queue drained: admitted again
            assert _inflight(ex) == 0
            if rejected_before is not None:
                assert _sample("offload_rejected_calls_total", **labels) == rejected_before + 2
        finally:
            await anyio.Path(gate).touch()
            await ex.aclose()

    def _queues(self, strategy: str) -> bool:
        probe = self.new_executor(strategy)
        try:
            return probe.capacity is not None
        finally:
            probe.shutdown()

    async def test_cancelled_queued_calls_free_their_place(self, strategy: str, tmp_path: Path) -> None:
        if not self._queues(strategy):
            pytest.skip(f"{strategy} has no queue (capacity() is None): max_queue does not apply")
        ex = self.new_executor(strategy, max_queue=2)
        capacity = self._needs_queue(ex)
        gate = str(tmp_path / "gate")
        try:
            async with anyio.create_task_group() as tg:
                for i in range(capacity + 2):
                    tg.start_soon(ex.run, f.gated, gate, str(tmp_path), f"a{i}")
                await _wait_until(lambda: _inflight(ex) == capacity + 2)
                with pytest.raises(offload.Overloaded):
                    await ex.run(f.add, 1)
                tg.cancel_scope.cancel()
            # The running calls still hold their workers; the queued ones left.
            assert _inflight(ex) <= capacity
            await anyio.Path(gate).touch()
            await _wait_until(lambda: _inflight(ex) == 0)
            assert await ex.run(f.add, 2, b=2) == 4
        finally:
            await anyio.Path(gate).touch()
            await ex.aclose()

    async def test_admission_refuses_a_request_early_and_never_halfway(
        self, strategy: str, tmp_path: Path
    ) -> None:
        if not self._queues(strategy):
            pytest.skip(f"{strategy} has no queue (capacity() is None): max_queue does not apply")
        ex = self.new_executor(strategy, max_queue=0)
        capacity = self._needs_queue(ex)
        gate = str(tmp_path / "gate")
        label = "offload.testing.request"
        labels = {"strategy": strategy, "function": label, "reason": "overloaded"}
        refused_before = _sample("offload_rejected_calls_total", **labels)
        try:
            assert not _overloaded(ex)
            async with anyio.create_task_group() as tg:
                with ex.admission(label):
                    # One admitted request (holding one place) may put more calls in flight than the bound.
                    for i in range(capacity + 3):
                        tg.start_soon(ex.run, f.gated, gate, str(tmp_path), f"part{i}")
                    await _wait_until(lambda: _inflight(ex) == capacity + 4)
                assert _inflight(ex) == capacity + 3  # the place was given back
                assert _overloaded(ex)
                with pytest.raises(offload.Overloaded), ex.admission(label):
                    pass  # a full executor refuses the request before it starts
                with pytest.raises(offload.Overloaded):
                    await ex.run(f.add, 1)  # outside any admitted request
                await anyio.Path(gate).touch()
            assert sorted(os.listdir(tmp_path)) == sorted(["gate", *(f"part{i}" for i in range(capacity + 3))])
            if refused_before is not None:
                assert _sample("offload_rejected_calls_total", **labels) == refused_before + 1
            assert not _overloaded(ex)
        finally:
            await anyio.Path(gate).touch()
            await ex.aclose()

    def test_admitted_requests_hold_a_place_until_released(self, strategy: str) -> None:
        if not self._queues(strategy):
            pytest.skip(f"{strategy} has no queue (capacity() is None): max_queue does not apply")
        ex = self.new_executor(strategy, max_queue=1)
        capacity = self._needs_queue(ex)
        try:
            with contextlib.ExitStack() as stack:
                # A burst: capacity + max_queue requests admitted before any made a call.
                places = [stack.enter_context(ex.admission("burst")) for _ in range(capacity + 1)]
                with pytest.raises(offload.Overloaded), ex.admission("burst"):
                    pass
                places[0].release()
                places[0].release()  # idempotent
                with ex.admission("burst"):
                    pass
            assert _inflight(ex) == 0
        finally:
            ex.shutdown()

    # ---- deadlines -------------------------------------------------------------------

    async def test_deadline_drops_a_queued_call_before_it_runs(self, strategy: str, tmp_path: Path) -> None:
        ex = self.new_executor(strategy)
        gate = str(tmp_path / "gate")
        labels = {"strategy": strategy, "function": f"{f.__name__}.gated", "reason": "deadline"}
        dropped_before = _sample("offload_dropped_calls_total", **labels)
        try:
            capacity = self._needs_queue(ex)
            async with anyio.create_task_group() as tg:
                for i in range(capacity):
                    tg.start_soon(ex.run, f.gated, gate, str(tmp_path), f"busy{i}")
                await _wait_until(lambda: _inflight(ex) == capacity)
                started = time.perf_counter()
                with pytest.raises(TimeoutError, match="timeout of 0.2s"):
                    await ex.run_with_timeout(0.2, f.gated, gate, str(tmp_path), "late")
                waited = time.perf_counter() - started
                await anyio.Path(gate).touch()
            await _wait_until(lambda: _inflight(ex) == 0)
            assert not (tmp_path / "late").exists()
            assert waited < 10  # it did not wait for the gate (30 s)
            if dropped_before is not None:
                assert _sample("offload_dropped_calls_total", **labels) == dropped_before + 1
        finally:
            await anyio.Path(gate).touch()
            await ex.aclose()

    async def test_run_with_timeout_returns_in_time_and_keeps_fn_keywords(
        self, executor: offload.Executor
    ) -> None:
        assert await executor.run_with_timeout(30, f.echo_args, 1, timeout=5) == ((1,), {"timeout": 5})
        assert await executor.run_with_timeout(None, f.add, 1, b=1) == 2

    async def test_make_async_timeout(self, strategy: str) -> None:
        ex = self.new_executor(strategy)
        try:
            await self._skip_if_on_callers_thread(ex)
            slow = offload.make_async(f.sleep_and_return, executor=ex, timeout=0.2)
            with pytest.raises(TimeoutError):
                await slow(1, "never")
            fast = offload.make_async(f.add, executor=ex, timeout=30)
            assert await fast(20, b=22) == 42
        finally:
            ex.shutdown(wait=False, cancel_futures=True)

    # ---- metrics ---------------------------------------------------------------------

    async def test_metrics_count_calls_and_return_gauges_to_zero(self, strategy: str) -> None:
        labels = {"strategy": strategy, "function": f"{f.__name__}.add"}
        runs_before = _sample("offload_run_seconds_count", **labels)
        if runs_before is None:
            pytest.skip("metrics are off (prometheus_client is not installed)")
        waits_before = _sample("offload_queue_wait_seconds_count", **labels)
        ex = self.new_executor(strategy)
        try:
            async with anyio.create_task_group() as tg:
                for i in range(20):
                    tg.start_soon(ex.run, f.add, i)
        finally:
            await ex.aclose()
        assert _sample("offload_run_seconds_count", **labels) == runs_before + 20
        assert _sample("offload_queue_wait_seconds_count", **labels) == (waits_before or 0) + 20
        assert _sample("offload_queued_calls", **labels) == 0
        assert _sample("offload_running_calls", **labels) == 0
        with pytest.raises(offload.ExecutorClosed):
            await ex.run(f.add, 1)
        assert (_sample("offload_rejected_calls_total", **labels, reason="closed") or 0) >= 1

    # ---- start -----------------------------------------------------------------------

    @staticmethod
    def _init_runs(directory: Path) -> tuple[list[str], int]:
        files = sorted(directory.iterdir())
        return [p.name for p in files], sum(len(p.read_text().splitlines()) for p in files)

    @staticmethod
    def _starts_workers(ex: offload.Executor) -> bool:
        return type(ex.strategy).start is not offload.strategy.Strategy.start

    async def test_start_warms_every_worker_before_the_first_call(self, strategy: str, tmp_path: Path) -> None:
        ex = self.new_executor(strategy, initializer=f.count_init, initargs=(str(tmp_path),))
        try:
            await anyio.to_thread.run_sync(ex.start)
            if not self._starts_workers(ex):
                assert self._init_runs(tmp_path) == ([], 0)  # nothing to start, nothing ran
                return
            started, runs = self._init_runs(tmp_path)
            workers = getattr(ex.strategy, "max_workers", None)
            if isinstance(workers, int) and getattr(ex.strategy, "express_cost", 0) > 0:
                workers += 1  # the express worker starts too
            assert runs == workers if isinstance(workers, int) else runs >= 1
            await anyio.to_thread.run_sync(ex.start)  # idempotent
            for _ in range(20):
                await ex.run(f.add, 1, 1)
            # The calls ran on the workers start() made: no worker was started for them.
            assert self._init_runs(tmp_path) == (started, runs)
        finally:
            await ex.aclose()
        with pytest.raises(offload.ExecutorClosed):
            ex.start()

    async def test_start_reports_a_failing_initializer(self, strategy: str) -> None:
        ex = self.new_executor(strategy, initializer=f.fail_init)
        try:
            if not self._starts_workers(ex):
                ex.start()  # nothing to start: the failure shows at the first call
                return
            with pytest.raises(offload.OffloadError) as info:
                await anyio.to_thread.run_sync(ex.start)
            assert "initializer broke" in repr(info.value) + repr(info.value.__cause__)
            # Calls fail the same way, and end.
            with anyio.fail_after(60), pytest.raises(offload.OffloadError):
                await ex.run(f.add, 1, 1)
        finally:
            with anyio.fail_after(60):
                await ex.aclose()

    # ---- shutdown --------------------------------------------------------------------

    async def test_closed_executor_refuses_calls(self, strategy: str) -> None:
        ex = self.new_executor(strategy)
        assert await ex.run(f.add, 1) == 1
        await ex.aclose()
        assert ex.closed
        with pytest.raises(offload.ExecutorClosed):
            await ex.run(f.add, 1)
        with pytest.raises(offload.ExecutorClosed):
            ex.submit(f.add, 1)
        ex.shutdown()  # idempotent

    async def test_context_managers(self, strategy: str) -> None:
        async with self.new_executor(strategy) as ex:
            assert await ex.run(f.add, 1, 1) == 2
        assert ex.closed
        with self.new_executor(strategy) as ex2:
            assert ex2.submit(f.add, 2, 2).result(timeout=30) == 4
        assert ex2.closed

    async def test_shutdown_leaves_no_threads_behind(self, strategy: str) -> None:
        before = set(threading.enumerate())
        ex = self.new_executor(strategy)
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(ex.run, f.sleep_and_return, 0.01)
        await ex.aclose()
        # anyio's own to_thread worker (used by aclose) is idle and may linger: it is not ours.
        leftover = [t for t in set(threading.enumerate()) - before if t.name.startswith("offload")]
        assert leftover == []

    def test_shutdown_cancel_futures_drops_queued_calls(self, strategy: str, tmp_path: Path) -> None:
        ex = self.new_executor(strategy, max_workers=1)
        try:
            capacity = self._needs_queue(ex)
            gate = tmp_path / "gate"
            started = [tmp_path / f"started{i}" for i in range(capacity)]
            running = [ex.submit(f.hold_until, str(gate), str(p)) for p in started]
            deadline = time.monotonic() + 60
            while not all(p.exists() for p in started) and time.monotonic() < deadline:
                time.sleep(0.005)
            queued = [ex.submit(f.write_marker, str(tmp_path / "q")) for _ in range(5)]
            opener = threading.Timer(0.2, gate.touch)
            opener.start()
            ex.shutdown(wait=True, cancel_futures=True)
            opener.join()
            assert [r.result(timeout=0) for r in running] == ["held"] * capacity
            assert all(q.cancelled() for q in queued)
            assert _markers(tmp_path / "q") == 0
            with pytest.raises(concurrent.futures.CancelledError):
                queued[0].result(timeout=0)
        finally:
            ex.shutdown()

    async def test_aclose_timeout_fails_queued_calls_and_lets_running_ones_finish(self, strategy: str) -> None:
        if not self._queues(strategy):
            pytest.skip(f"{strategy} has no queue and nothing running off the loop")
        ex = self.new_executor(strategy, max_queue=50)
        capacity = self._needs_queue(ex)
        # Workers up first (they may take seconds to start), so the calls below
        # are running, not queued, when the shutdown begins.
        await anyio.to_thread.run_sync(ex.start)
        outcomes: dict[str, Any] = {}

        async def one(tag: str, seconds: float) -> None:
            try:
                outcomes[tag] = await ex.run(f.square_after, seconds, 3)
            except Exception as exc:
                outcomes[tag] = exc

        async with anyio.create_task_group() as tg:
            for i in range(capacity):
                tg.start_soon(one, f"running{i}", 0.3)
            await _wait_until(lambda: _inflight(ex) == capacity)
            await anyio.sleep(0.05)  # let the workers start them
            for i in range(5):
                tg.start_soon(one, f"queued{i}", 0.0)
            await _wait_until(lambda: _inflight(ex) == capacity + 5)
            await ex.aclose(timeout=30)
        with pytest.raises(offload.ExecutorClosed):
            await ex.run(f.add, 1)
        for i in range(capacity):
            assert outcomes[f"running{i}"] == 9
        for i in range(5):
            assert isinstance(outcomes[f"queued{i}"], offload.ExecutorClosed), outcomes[f"queued{i}"]
            assert "shut down before this call started" in str(outcomes[f"queued{i}"])

    # ---- fork and crashes ------------------------------------------------------------

    def test_an_executor_used_before_fork_serves_the_child(self, strategy: str) -> None:
        """In a child made by `os.fork()`, a call on the parent's executor runs
        on the child's own workers, or fails with `OffloadError` (a strategy
        that cannot work in a forked child says so): it never hangs, and the
        parent's executor keeps working."""
        if not hasattr(os, "fork"):
            pytest.skip("no os.fork() on this platform")
        ex = self.new_executor(strategy)
        try:
            assert ex.submit(f.add, 1, 1).result(timeout=60) == 2
            with warnings.catch_warnings():
                # Python 3.12+ warns about forking a process with threads: this test does it on purpose.
                warnings.simplefilter("ignore", DeprecationWarning)
                child = os.fork()
            if child == 0:  # pragma: no cover (the child)
                code = 1
                try:
                    signal.alarm(45)  # a hung child dies, and the test fails, instead of hanging
                    code = 0 if ex.submit(f.add, 1, 2).result(timeout=30) == 3 else 1
                except offload.OffloadError:
                    code = 3
                except BaseException:
                    code = 2
                finally:
                    try:
                        # The workers the child started are the child's to stop
                        # (a ProcessPoolExecutor's outlive an owner that exits
                        # without shutting it down).
                        ex.shutdown()
                    except BaseException:
                        code = code or 4
                    os._exit(code)
            deadline = time.monotonic() + 60
            while not (status := os.waitpid(child, os.WNOHANG))[0]:
                if time.monotonic() > deadline:
                    os.kill(child, signal.SIGKILL)
                    status = os.waitpid(child, 0)
                    break
                time.sleep(0.05)
            assert os.waitstatus_to_exitcode(status[1]) in (0, 3)
            assert ex.submit(f.add, 5, 5).result(timeout=60) == 10
        finally:
            ex.shutdown()

    async def test_a_crashed_worker_fails_its_call_and_is_replaced(self, strategy: str) -> None:
        ex = self.new_executor(strategy, max_workers=1)
        try:
            if not type(ex.strategy).replaces_crashed_workers:
                pytest.skip(f"{strategy} does not replace crashed workers (replaces_crashed_workers = False)")
            restarts = {"strategy": strategy, "reason": "crashed"}
            restarts_before = _sample("offload_worker_restarts_total", **restarts)
            with pytest.raises(offload.WorkerCrashed):
                await ex.run(f.kill_self, os.getpid())
            assert await ex.run(f.add, 1, b=1) == 2
            if restarts_before is not None:
                await _wait_until(
                    lambda: _sample("offload_worker_restarts_total", **restarts) == restarts_before + 1
                )
        finally:
            await ex.aclose()
