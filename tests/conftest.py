from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

import offload
from offload._registry import _registry, option_names
from offload.testing import BACKENDS


@pytest.fixture(params=BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


#: The docs' example strategies (docs/examples/custom_strategy.py,
#: pool_strategy.py), registered here as a plugin's entry point would register
#: them, so the contract suite holds them to the same rules as the built-ins:
#: the docs cannot teach a strategy that breaks them.
EXAMPLE_STRATEGY = "pinned-thread"
#: The other example, for the contract suite only (its workers spawn slowly).
POOL_EXAMPLE = "pool"
_registry._sources.setdefault("pinned-thread", "docs.examples.custom_strategy:PinnedThreadStrategy")
_registry._sources.setdefault("pool", "docs.examples.pool_strategy:PoolStrategy")


def strategies_under_test() -> tuple[str, ...]:
    """Every registered strategy (plugins included) and the docs' example, or
    the ones named in `OFFLOAD_TEST_STRATEGIES` (comma-separated): how a
    plugin's own suite runs this contract suite against its strategy alone."""
    known = (*offload.STRATEGIES, EXAMPLE_STRATEGY, POOL_EXAMPLE)
    named = [s.strip() for s in os.environ.get("OFFLOAD_TEST_STRATEGIES", "").split(",") if s.strip()]
    unknown = sorted(set(named) - set(known))
    if unknown:
        raise pytest.UsageError(
            f"OFFLOAD_TEST_STRATEGIES names {unknown}, not registered; registered: {known}"
        )
    return tuple(named) or tuple(s for s in known if s != POOL_EXAMPLE)


@pytest.fixture(params=strategies_under_test())
def strategy(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def has_pool(strategy: str) -> bool:
    """Whether the strategy takes `max_workers` (inline and async-renderer do not)."""
    return "max_workers" in option_names(_registry.get(strategy))


def small_options(strategy: str, **extra: Any) -> dict[str, Any]:
    """Options that give each strategy a small, bounded pool for tests."""
    options: dict[str, Any] = dict(extra)
    if has_pool(strategy):
        options.setdefault("max_workers", 2)
    return options


@pytest.fixture
def executor(strategy: str) -> Iterator[offload.Executor]:
    ex = offload.get_executor(strategy, **small_options(strategy))
    try:
        yield ex
    finally:
        ex.shutdown(wait=True, cancel_futures=True)
