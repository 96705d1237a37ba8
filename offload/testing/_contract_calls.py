"""The contract suite's tests of results and errors, `make_async`, `contextvars` and worker state (part of `StrategyContract`)."""

from __future__ import annotations

import asyncio
import traceback
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import offload

from . import _functions as f
from ._contract_base import (
    _BACKEND_NAMES,
    _ContractBase,
    _normalise,
    _read_var,
    _var,
    _with_messages,
    _with_values,
)


class CallsContract(_ContractBase):
    """The contract: results and errors, `make_async`, `contextvars` and worker state."""

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
        # A wide margin: a strategy may start its first worker for this call (a Ray
        # actor took over 30 s on a 2-core machine under load); a hang still fails.
        assert await anyio.to_thread.run_sync(future.result, 120) == 3
        assert list(executor.map(f.add, [1, 2, 3], [10, 20, 30])) == [11, 22, 33]
        failing = executor.submit(f.raise_value_error, "nope")
        with pytest.raises(ValueError, match="nope"):
            await anyio.to_thread.run_sync(failing.result, 120)

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
            pytest.fail(f"{fn.__name__}({message!r}) raised nothing on {sync_executor.name}")

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
        assert [s["tag"] for s in states] == ["T"] * len(states)
        # Each worker has its own state object: calls per worker add up to the total.
        workers: dict[tuple[int, int], int] = {}
        for s in states:
            key = (s["pid"], s["thread"])
            workers[key] = max(workers.get(key, 0), s["calls"])
        assert sum(workers.values()) == 40
