"""Strategy names → executor classes: built-ins, then the `offload.strategies` entry points."""

from __future__ import annotations

import importlib
import inspect
import threading
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from ._config import (
    DEFAULT_STRATEGY,
    STRATEGY_ENV,
    max_workers_from_env,
    strategy_from_env,
)
from ._errors import ConfigError
from ._executor import Executor

ENTRY_POINT_GROUP = "offload.strategies"

# Built-ins are imported on first use, so `import offload` stays light (the
# process strategy pulls in multiprocessing, the batching one its own machinery).
_BUILTINS: dict[str, str] = {
    "inline": "offload._strategies._inline:InlineExecutor",
    "thread": "offload._strategies._thread:ThreadExecutor",
    "process": "offload._strategies._process:ProcessExecutor",
    "async-renderer": "offload._strategies._batching:BatchingExecutor",
}


class _Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sources: dict[str, str | EntryPoint] = dict(_BUILTINS)
        self._loaded: dict[str, type[Executor]] = {}
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            # A plugin may not shadow a built-in: the name would mean two things.
            self._sources.setdefault(ep.name, ep)

    def names(self) -> tuple[str, ...]:
        return tuple(self._sources)

    def get(self, name: str) -> type[Executor]:
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
    def _load(name: str, source: str | EntryPoint) -> type[Executor]:
        if isinstance(source, str):
            module, _, attr = source.partition(":")
            obj: Any = getattr(importlib.import_module(module), attr)
        else:
            try:
                obj = source.load()
            except Exception as exc:
                raise ConfigError(
                    f"offload strategy plugin {name!r} ({source.value}) failed to load: {exc!r}"
                ) from exc
        if not (isinstance(obj, type) and issubclass(obj, Executor)):
            raise ConfigError(
                f"offload strategy plugin {name!r} ({source if isinstance(source, str) else source.value}) "
                f"is {obj!r}, not a subclass of offload.Executor"
            )
        if inspect.isabstract(obj):
            raise ConfigError(f"offload strategy plugin {name!r} is abstract: {obj!r}")
        return obj


_registry = _Registry()

#: The registered strategy names: the built-ins, then plugins found at import.
STRATEGIES: tuple[str, ...] = _registry.names()


def option_names(cls: type[Executor]) -> tuple[str, ...]:
    """The keyword options a strategy's constructor takes."""
    params = inspect.signature(cls).parameters.values()
    return tuple(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def resolve(strategy: str | None, options: dict[str, Any]) -> tuple[type[Executor], dict[str, Any]]:
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
    accepted = option_names(cls)
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


def get_executor(strategy: str | None = None, **options: Any) -> Executor:
    """Build a new executor.

    Args:
        strategy: a name from `offload.STRATEGIES`; `None` reads `OFFLOAD_STRATEGY`,
            else uses `"thread"`.
        **options: the strategy's options (`max_workers`, `initializer`,
            `initargs`, ...). `max_workers=None` reads `OFFLOAD_MAX_WORKERS`
            (ignored by strategies without a worker count), else the strategy's default.

    Raises:
        ConfigError: unknown strategy, unknown option for that strategy, or a bad value.
    """
    cls, resolved = resolve(strategy, options)
    return cls(**resolved)
