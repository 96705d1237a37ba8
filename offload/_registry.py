"""Strategy names → strategy classes: built-ins, then the `offload.strategies` entry points."""

from __future__ import annotations

import importlib
import inspect
import threading
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from ._builtins import BUILTIN_STRATEGIES
from ._config import (
    DEFAULT_STRATEGY,
    STRATEGY_ENV,
    max_workers_from_env,
    strategy_from_env,
)
from ._errors import ConfigError
from ._executor import Executor
from ._strategy import Strategy

ENTRY_POINT_GROUP = "offload.strategies"

# Built-ins are imported on first use, so `import offload` stays light.
_BUILTINS: dict[str, str] = {b.name: b.target for b in BUILTIN_STRATEGIES}

#: Options every strategy takes, because the executor owns them.
EXECUTOR_OPTIONS = ("max_queue", "max_queued_cost", "lanes", "scheduling")


class _Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sources: dict[str, str | EntryPoint] = dict(_BUILTINS)
        self._loaded: dict[str, type[Strategy]] = {}
        #: Plugins registered under a built-in's name: refused, loudly, where
        #: that name is used (ignoring one would run the built-in instead of
        #: the code its author registered, with no sign of it).
        self._clashes: dict[str, list[EntryPoint]] = {}
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name in _BUILTINS:
                self._clashes.setdefault(ep.name, []).append(ep)
            else:
                self._sources.setdefault(ep.name, ep)

    def names(self) -> tuple[str, ...]:
        return tuple(self._sources)

    def get(self, name: str) -> type[Strategy]:
        clashes = self._clashes.get(name)
        if clashes:
            plugins = ", ".join(f"{ep.value!r}" for ep in clashes)
            raise ConfigError(
                f"offload strategy plugin {name!r} ({plugins}) is registered under the name of "
                f"the built-in strategy {name!r}; a plugin may not take a built-in's name: "
                f"register it under another name in the entry-point group "
                f"{ENTRY_POINT_GROUP!r}, or uninstall the package that registers it"
            )
        with self._lock:
            cls = self._loaded.get(name)
            if cls is not None:
                return cls
            source = self._sources.get(name)
            if source is None:
                raise ConfigError(
                    f"unknown offload strategy {name!r}; valid strategies: "
                    + ", ".join(repr(n) for n in self._sources)
                )
            cls = self._load(name, source)
            self._loaded[name] = cls
            return cls

    @staticmethod
    def _load(name: str, source: str | EntryPoint) -> type[Strategy]:
        if isinstance(source, str):
            module, _, attr = source.partition(":")
            return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]
        plugin = f"offload strategy plugin {name!r} ({source.value})"
        try:
            obj: Any = source.load()
        except Exception as exc:
            raise ConfigError(f"{plugin} failed to load: {exc!r}") from exc
        if not (isinstance(obj, type) and issubclass(obj, Strategy)):
            raise ConfigError(f"{plugin} is {obj!r}, not a subclass of offload.strategy.Strategy")
        if inspect.isabstract(obj):
            missing = ", ".join(sorted(getattr(obj, "__abstractmethods__", ())))
            raise ConfigError(f"{plugin} is abstract: {obj.__qualname__} does not implement {missing}")
        declared = getattr(obj, "name", None)
        if declared != name:
            # The name labels its metrics and is what users write: one name only.
            raise ConfigError(
                f"{plugin}: {obj.__qualname__}.name is {declared!r}, but it is registered as "
                f"{name!r}; they must be equal"
            )
        clash = sorted(set(option_names(obj)) & set(EXECUTOR_OPTIONS))
        if clash:
            raise ConfigError(
                f"{plugin}: {obj.__qualname__} takes {', '.join(map(repr, clash))}, which the "
                "executor owns; drop it from the strategy's constructor"
            )
        return obj


_registry = _Registry()

#: The registered strategy names: the built-ins, then plugins found at import.
STRATEGIES: tuple[str, ...] = _registry.names()


def option_names(cls: type[Strategy]) -> tuple[str, ...]:
    """The keyword options a strategy's constructor takes."""
    params = inspect.signature(cls).parameters.values()
    return tuple(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def resolve(strategy: str | None, options: dict[str, Any]) -> tuple[type[Strategy], dict[str, Any]]:
    """Apply argument > environment > default, and check the options against the strategy."""
    if strategy is None:
        strategy = strategy_from_env() or DEFAULT_STRATEGY
        source = STRATEGY_ENV if strategy_from_env() else "default"
    else:
        source = "strategy"
    if not isinstance(strategy, str):
        raise ConfigError(f"strategy must be a name (str), got {strategy!r}; valid: {STRATEGIES}")
    try:
        cls = _registry.get(strategy)
    except ConfigError as exc:
        if source == STRATEGY_ENV:
            raise ConfigError(f"{STRATEGY_ENV}: {exc}") from None
        raise
    accepted = (*option_names(cls), *EXECUTOR_OPTIONS)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ConfigError(
            f"strategy {strategy!r} takes no option {', '.join(map(repr, unknown))}; "
            f"its options are: {', '.join(accepted) or '(none)'}"
        )
    resolved = dict(options)
    if "max_workers" in accepted and resolved.get("max_workers") is None:
        env_workers = max_workers_from_env()
        if env_workers is not None:
            resolved["max_workers"] = env_workers
    return cls, resolved


def build(cls: type[Strategy], options: dict[str, Any]) -> Executor:
    """An executor for strategy class `cls` with resolved `options` (the
    executor's own options go to the executor, the rest to the strategy)."""
    own = {k: v for k, v in options.items() if k in EXECUTOR_OPTIONS}
    return Executor(cls(**{k: v for k, v in options.items() if k not in own}), **own)


def get_executor(strategy: str | None = None, **options: Any) -> Executor:
    """Build a new executor.

    Args:
        strategy: a registered name: a built-in (`"inline"`, `"thread"`,
            `"process"`, `"async-renderer"`) or a plugin's entry-point name in
            the group `offload.strategies`. `offload.STRATEGIES` lists both,
            as installed when `offload` was first imported; an unknown name's
            `ConfigError` lists them too. `None` reads `OFFLOAD_STRATEGY`,
            else uses `"thread"`.
        **options: the strategy's options (`max_workers`, `initializer`,
            `initargs`, ...), and the executor's (`max_queue`,
            `max_queued_cost`, `lanes`, `scheduling`: see `Executor`).
            `max_workers=None` reads `OFFLOAD_MAX_WORKERS` (ignored by
            strategies without a worker count), else the strategy's default.

    Raises:
        ConfigError: unknown strategy, unknown option for that strategy, or a bad value.
    """
    cls, resolved = resolve(strategy, options)
    return build(cls, resolved)
