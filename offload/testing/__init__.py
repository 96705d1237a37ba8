"""offload.testing: the contract suite for strategy authors (needs pytest).

Subclass `StrategyContract` in a test module of your plugin, set
`strategy_name` to your strategy's registered name, and run pytest:

    from offload.testing import StrategyContract

    class TestPool(StrategyContract):
        strategy_name = "pool"

The built-in strategies and the `ray` plugin run the same suite.
`shm_files` finds the shared-memory files a stopped process left behind.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._contract import BACKENDS, StrategyContract
    from ._shm import shm_files

__all__ = ["BACKENDS", "StrategyContract", "shm_files"]

#: The private module of each public name.
_MODULES = {"BACKENDS": "._contract", "StrategyContract": "._contract", "shm_files": "._shm"}

#: The modules that hold the suite's assertions.
_ASSERTING = ("_contract", "_contract_base", "_contract_calls", "_contract_queue", "_contract_admission", "_contract_lifecycle")


def _rewrite_asserts() -> None:
    """Have pytest rewrite the suite's `assert`s, so that a failure shows its
    values, as in the author's own test modules (pytest rewrites only those
    unless told): before the modules are imported, each one not yet imported
    (pytest warns of those)."""
    import pytest

    names = [f"{__name__}.{module}" for module in _ASSERTING]
    pytest.register_assert_rewrite(*(name for name in names if name not in sys.modules))


def __getattr__(name: str) -> Any:
    # Imported on first use: a worker process that unpickles one of the
    # suite's functions (`offload.testing._functions`) must not import pytest,
    # nor a test that needs only `shm_files`.
    if name in _MODULES:
        if _MODULES[name] == "._contract":
            _rewrite_asserts()
        return getattr(importlib.import_module(_MODULES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
