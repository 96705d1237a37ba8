"""Hypothesis properties: every strategy behaves like calling the function directly."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import offload

from . import helpers
from .conftest import small_options

# Picklable values (the process strategy sends them across a pipe).
scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=20) | st.binary(max_size=32)
scalars |= st.floats(allow_nan=False)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4)
    | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)

SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def run_on(backend: Any, fn: Any, *args: Any) -> Any:
    name, options = backend
    return anyio.run(fn, *args, backend=name, backend_options=options)


async def peak_concurrency(ex: offload.Executor, directory: Path, calls: int, hold: float) -> int:
    seen: list[int] = []

    async def one() -> None:
        seen.append(await ex.run(helpers.hold_slot, str(directory), hold))

    async with anyio.create_task_group() as tg:
        for _ in range(calls):
            tg.start_soon(one)
    return max(seen)


@pytest.fixture
def sync_executor(strategy: str) -> Any:
    ex = offload.get_executor(strategy, **small_options(strategy))
    yield ex
    ex.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@SETTINGS
@given(args=st.lists(values, max_size=3), kwargs=st.dictionaries(st.sampled_from("abc"), values, max_size=3))
def test_same_result_as_a_direct_call(sync_executor: offload.Executor, anyio_backend: str, args: list[Any], kwargs: dict[str, Any]) -> None:
    expected = helpers.echo_args(*args, **kwargs)

    async def go() -> Any:
        return await sync_executor.run(helpers.echo_args, *args, **kwargs)

    result = run_on((anyio_backend, {}), go)
    # Tuples may come back as tuples only: compare structurally.
    assert _normalise(result) == _normalise(expected)


def _normalise(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, *(_normalise(v) for v in value)]
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items()}
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


@SETTINGS
@given(message=st.text(max_size=40), kind=st.sampled_from(["custom", "value"]))
def test_exceptions_are_identical(sync_executor: offload.Executor, message: str, kind: str) -> None:
    fn = helpers.raise_custom if kind == "custom" else helpers.raise_value_error
    expected_type = helpers.CustomError if kind == "custom" else ValueError

    async def go() -> BaseException:
        try:
            await sync_executor.run(fn, message)
        except BaseException as exc:
            return exc
        raise AssertionError("no exception")

    exc = run_on(("asyncio", {}), go)
    assert type(exc) is expected_type
    assert exc.args == (message,)


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
def test_thousand_concurrent_callers_get_their_own_results(sync_executor: offload.Executor, anyio_backend: str) -> None:
    async def go() -> dict[int, Any]:
        results: dict[int, Any] = {}

        async def one(i: int) -> None:
            results[i] = await sync_executor.run(helpers.identity, (i, str(i)))

        async with anyio.create_task_group() as tg:
            for i in range(1000):
                tg.start_soon(one, i)
        return results

    results = run_on((anyio_backend, {}), go)
    assert results == {i: (i, str(i)) for i in range(1000)}


@SETTINGS
@given(max_workers=st.integers(1, 4), calls=st.integers(1, 12))
def test_peak_concurrency_never_exceeds_the_bound(tmp_path_factory: pytest.TempPathFactory, max_workers: int, calls: int) -> None:
    directory = tmp_path_factory.mktemp("slots")
    ex = offload.get_executor("thread", max_workers=max_workers)
    try:
        peak = run_on(("asyncio", {}), peak_concurrency, ex, directory, calls, 0.01)
    finally:
        ex.shutdown()
    assert 1 <= peak <= max_workers


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cancel_mask=st.lists(st.booleans(), min_size=1, max_size=8))
def test_cancelled_calls_that_have_not_started_never_run(tmp_path_factory: pytest.TempPathFactory, cancel_mask: list[bool]) -> None:
    directory = tmp_path_factory.mktemp("cancel")
    ex = offload.get_executor("thread", max_workers=1)

    async def go() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ex.run, helpers.sleep_and_return, 0.05)
            await anyio.sleep(0.01)  # the blocker is running; the rest queue behind it
            scopes = []
            for i, cancel in enumerate(cancel_mask):
                scope = anyio.CancelScope()
                scopes.append((scope, cancel))

                async def one(i: int = i, scope: anyio.CancelScope = scope) -> None:
                    with scope:
                        await ex.run(helpers.write_marker, str(directory / f"{i}"))

                tg.start_soon(one)
            await anyio.lowlevel.checkpoint()
            for scope, cancel in scopes:
                if cancel:
                    scope.cancel()

    try:
        run_on(("asyncio", {}), go)
    finally:
        ex.shutdown()
    ran = {int(p.name) for p in directory.iterdir()}
    assert ran == {i for i, cancel in enumerate(cancel_mask) if not cancel}
