"""The public surface: `offload.__all__` is exactly what the package exports."""

from __future__ import annotations

import inspect
import types

import offload


def test_all_lists_every_public_name() -> None:
    public = {
        name
        for name, value in vars(offload).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert set(offload.__all__) == public


def test_all_names_come_from_private_modules() -> None:
    for name in offload.__all__:
        module = getattr(getattr(offload, name), "__module__", "offload")
        assert module == "offload" or module.startswith("offload._"), (name, module)


def test_builtin_strategies_are_registered() -> None:
    assert {"inline", "thread"} <= set(offload.STRATEGIES)
    assert isinstance(offload.STRATEGIES, tuple)


def test_error_hierarchy() -> None:
    assert issubclass(offload.ConfigError, offload.OffloadError)
    assert issubclass(offload.ConfigError, ValueError)
    assert issubclass(offload.WorkerCrashed, offload.OffloadError)
    assert issubclass(offload.ExecutorClosed, offload.OffloadError)


def test_concrete_strategies_are_final() -> None:
    from offload._registry import _registry

    for name in offload.STRATEGIES:
        cls = _registry.get(name)
        assert not inspect.isabstract(cls)
        assert getattr(cls, "__final__", False), f"{cls} should be @final"
        assert cls.name == name
