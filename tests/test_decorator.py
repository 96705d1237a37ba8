"""`make_async`: the three forms, signature preservation, config errors, sharing
(its forms under every strategy: the contract suite, `offload.testing`)."""

from __future__ import annotations

import inspect

import pytest

import offload

from . import helpers

pytestmark = pytest.mark.anyio


def blocking_double(x: int, *, scale: int = 2) -> int:
    """Double it."""
    return x * scale


async def test_bare_form() -> None:
    wrapped = offload.make_async(blocking_double)
    assert inspect.iscoroutinefunction(wrapped)
    assert await wrapped(4) == 8
    assert wrapped.__name__ == "blocking_double"
    assert wrapped.__doc__ == "Double it."
    assert inspect.signature(wrapped) == inspect.signature(blocking_double)


async def test_explicit_executor() -> None:
    with offload.get_executor("thread", max_workers=1) as ex:
        wrapped = offload.make_async(helpers.add, executor=ex)
        assert wrapped.executor is ex  # type: ignore[attr-defined]
        assert await wrapped(5, 5) == 10


async def test_same_options_share_an_executor() -> None:
    a = offload.make_async(helpers.add, strategy="thread", max_workers=3)
    b = offload.make_async(helpers.identity, strategy="thread", max_workers=3)
    c = offload.make_async(helpers.identity, strategy="thread", max_workers=4)
    assert a.executor is b.executor  # type: ignore[attr-defined]
    assert a.executor is not c.executor  # type: ignore[attr-defined]


async def test_env_flag_chooses_the_strategy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFLOAD_STRATEGY", "inline")
    wrapped = offload.make_async(helpers.add)
    assert wrapped.executor.name == "inline"  # type: ignore[attr-defined]


def test_config_errors_at_decoration_time(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(offload.ConfigError, match="'nope'"):
        offload.make_async(helpers.add, strategy="nope")
    with pytest.raises(offload.ConfigError, match="max_workers"):
        offload.make_async(strategy="thread", max_workers=0)(helpers.add)
    with (
        pytest.raises(offload.ConfigError, match="either executor"),
        offload.get_executor("inline") as ex,
    ):
        offload.make_async(helpers.add, executor=ex, strategy="thread")
    monkeypatch.setenv("OFFLOAD_STRATEGY", "bogus")
    with pytest.raises(offload.ConfigError, match="OFFLOAD_STRATEGY"):
        offload.make_async(helpers.add)


def test_batch_needs_one_positional_parameter() -> None:
    with pytest.raises(offload.ConfigError, match="exactly one positional"):
        offload.make_async(helpers.fail_if, batch=lambda items: items)
    with pytest.raises(offload.ConfigError, match="exactly one positional"):
        offload.make_async(helpers.echo_args, batch=lambda items: items)
    # Ignored by strategies that do not batch: switching strategy never breaks code.
    wrapped = offload.make_async(helpers.identity, strategy="thread", batch=lambda items: items)
    assert wrapped.executor.name == "thread"  # type: ignore[attr-defined]


def test_rejects_coroutine_functions() -> None:
    async def already_async() -> None:
        pass

    with pytest.raises(offload.ConfigError, match="already a coroutine"):
        offload.make_async(already_async)


async def test_functions_survive_their_shared_executor_being_shut_down() -> None:
    options = {"strategy": "thread", "max_workers": 3, "thread_name_prefix": "failures-shared"}
    first = offload.make_async(helpers.add, **options)
    second = offload.make_async(helpers.identity, **options)
    assert first.executor is second.executor  # type: ignore[attr-defined]
    first.executor.shutdown()  # type: ignore[attr-defined]
    assert await second("still here") == "still here"
    assert await first(1, 2) == 3
    offload.shutdown_shared_executors()
    assert await first(2, 2) == 4
    assert await second("again") == "again"
    assert first.executor is second.executor  # type: ignore[attr-defined]
    assert not first.executor.closed  # type: ignore[attr-defined]
