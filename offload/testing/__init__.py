"""offload.testing: the contract suite for strategy authors (needs pytest).

Subclass `StrategyContract` in a test module of your plugin, set
`strategy_name` to your strategy's registered name, and run pytest:

    from offload.testing import StrategyContract

    class TestPool(StrategyContract):
        strategy_name = "pool"

The built-in strategies and the `ray` plugin run the same suite.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._contract import BACKENDS, StrategyContract

__all__ = ["BACKENDS", "StrategyContract"]


def __getattr__(name: str) -> Any:
    # Imported on first use: a worker process that unpickles one of the
    # suite's functions (`offload.testing._functions`) must not import pytest.
    if name in __all__:
        from . import _contract

        return getattr(_contract, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
