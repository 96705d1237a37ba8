"""offload's contract suite (`offload.testing.StrategyContract`) against every
registered strategy and the docs' examples (see `conftest.strategies_under_test`)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from offload.testing import StrategyContract

from .conftest import POOL_EXAMPLE, strategies_under_test


class TestContract(StrategyContract):
    @pytest.fixture(params=strategies_under_test())
    def strategy(self, request: pytest.FixtureRequest) -> str:
        return str(request.param)

    def strategy_options(self, strategy: str) -> dict[str, Any]:
        if strategy == "async-renderer":
            # One call at a time unless calls share a batch form: capacity() is the batch size.
            return {"max_batch_size": 1}
        return super().strategy_options(strategy)


@pytest.mark.skipif(
    bool(os.environ.get("OFFLOAD_TEST_STRATEGIES", "").strip()),
    reason="OFFLOAD_TEST_STRATEGIES names the strategies under test",
)
class TestPoolExample(StrategyContract):
    """docs/examples/pool_strategy.py, as its author would check it; on asyncio
    only (a strategy never touches the event loop, and its workers are slow to
    spawn: the other backends are the built-ins' business)."""

    strategy_name = POOL_EXAMPLE

    @pytest.fixture
    def anyio_backend(self) -> Any:
        return ("asyncio", {})


class TestContractWithExpress(StrategyContract):
    """`thread` and `process` with the express worker taking every call of
    the suite's default cost (1): `capacity()` counts it, and every contract
    (cancellation, shutdown, errors, the bound) holds with it."""

    @pytest.fixture(params=[s for s in ("thread", "process") if s in strategies_under_test()])
    def strategy(self, request: pytest.FixtureRequest) -> str:
        return str(request.param)

    def strategy_options(self, strategy: str) -> dict[str, Any]:
        return {**super().strategy_options(strategy), "express_cost": 1}

    @pytest.fixture
    def anyio_backend(self) -> Any:
        # The express slot is the dispatcher's, which never touches the event
        # loop: the backends are the plain suite's business.
        return ("asyncio", {})
