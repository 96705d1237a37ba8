"""The `thread` strategy's pool, as Hypothesis properties: the bound on
concurrency holds, and calls cancelled before they start never run (every
strategy's examples: the contract suite, `offload.testing`)."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import offload
from offload.testing._contract import _peak_concurrency

from . import helpers

SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def run_on(backend: Any, fn: Any, *args: Any) -> Any:
    name, options = backend
    return anyio.run(fn, *args, backend=name, backend_options=options)


@SETTINGS
@given(max_workers=st.integers(1, 4), calls=st.integers(1, 12))
def test_peak_concurrency_never_exceeds_the_bound(tmp_path_factory: pytest.TempPathFactory, max_workers: int, calls: int) -> None:
    directory = tmp_path_factory.mktemp("slots")
    ex = offload.get_executor("thread", max_workers=max_workers)
    try:
        peak = run_on(("asyncio", {}), _peak_concurrency, ex, directory, calls, 0.01)
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
