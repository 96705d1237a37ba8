"""The adapter's settings, read from `OFFLOAD_VLLM_*` (then `OFFLOAD_STRATEGY`) once, at plugin load."""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field

import offload

# `OFFLOAD_VLLM_*`, not `VLLM_*`: vLLM warns about every `VLLM_*` variable it does
# not know, at every start, and refuses them when told to fail hard
# (`Platform.validate_environ`, vllm/platforms/interface.py).
PREFIX = "OFFLOAD_VLLM_"
STRATEGY_ENV = "OFFLOAD_VLLM_STRATEGY"
WORKERS_ENV = "OFFLOAD_VLLM_WORKERS"
MAX_QUEUE_ENV = "OFFLOAD_VLLM_MAX_QUEUE"
RAY_ADDRESS_ENV = "OFFLOAD_VLLM_RAY_ADDRESS"
FALLBACK_STRATEGY_ENV = "OFFLOAD_STRATEGY"

#: Every variable this adapter reads; any other `OFFLOAD_VLLM_*` is a typo and refused.
KNOWN_ENV = (STRATEGY_ENV, WORKERS_ENV, MAX_QUEUE_ENV, RAY_ADDRESS_ENV)

#: The name each setting had first (`VLLM_OFFLOAD_*`): still read, with a
#: warning naming the new one. Any other `VLLM_OFFLOAD_*` is refused too.
LEGACY_PREFIX = "VLLM_OFFLOAD_"
LEGACY_NAMES = {name: LEGACY_PREFIX + name.removeprefix(PREFIX) for name in KNOWN_ENV}

#: The names the adapter knows how to wire into vLLM. A strategy must also be
#: registered in `offload.STRATEGIES` (`ray` is there once the `offload-ray`
#: plugin is installed).
ADAPTER_STRATEGIES = ("inline", "thread", "process", "async-renderer", "ray")

#: Strategies whose workers are other processes: they build their own
#: renderers from the engine's config, once per worker.
SPEC_STRATEGIES = ("process", "ray")


class OffloadVLLMConfigError(offload.ConfigError):
    """An `OFFLOAD_VLLM_*`/`OFFLOAD_*` setting is invalid; raised at plugin load."""


@dataclass(frozen=True)
class Settings:
    """What the plugin applies. `strategy=None` leaves vLLM's own behaviour untouched.

    Two settings are equal when they apply the same thing, whichever variables
    they were read from (`strategy_source`, `legacy_names`).
    """

    strategy: str | None
    workers: int | None
    strategy_source: str = field(compare=False)
    #: Offloaded calls that may wait for a worker; past it, requests get HTTP 503.
    max_queue: int | None = None
    #: The Ray cluster the `ray` strategy joins (`None`: `RAY_ADDRESS`, else a local instance).
    ray_address: str | None = None
    #: The settings (by their `OFFLOAD_VLLM_*` names) given under their old name.
    legacy_names: tuple[str, ...] = field(default=(), compare=False)

    def legacy_warning(self) -> str | None:
        """The message naming the new name of each old one set, or `None` when none is."""
        if not self.legacy_names:
            return None
        renames = ", ".join(f"{LEGACY_NAMES[name]} -> {name}" for name in self.legacy_names)
        return (
            f"offload-vllm: rename {renames}: the old VLLM_OFFLOAD_* names still work, but vLLM "
            "warns about every VLLM_* variable it does not know (and refuses them when it fails hard)"
        )


def _parse_workers(name: str, raw: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise OffloadVLLMConfigError(f"{name}={raw!r} is not an integer; give a worker count >= 1") from None
    if value < 1:
        raise OffloadVLLMConfigError(f"{name}={raw!r}: the worker count must be >= 1")
    return value


def adopt_new_names(settings: Settings, environ: MutableMapping[str, str] | None = None) -> None:
    """Move each setting `settings` read under its old name to its new name in
    `environ` (default `os.environ`), which it was read from: the processes
    started from here on, vLLM's among them, see only `OFFLOAD_VLLM_*` names."""
    env = os.environ if environ is None else environ
    for name in settings.legacy_names:
        value = env.pop(LEGACY_NAMES[name])
        env.setdefault(name, value)


def _unknown(env: Mapping[str, str]) -> list[str]:
    return sorted(
        k
        for k in env
        if (k.startswith(PREFIX) and k not in KNOWN_ENV)
        or (k.startswith(LEGACY_PREFIX) and k not in LEGACY_NAMES.values())
    )


def _lookup(env: Mapping[str, str], name: str, legacy: list[str]) -> tuple[str, str] | None:
    """`(variable, value)` for the setting `name`, from its name or its old one
    (then `name` is appended to `legacy`), or `None` when neither is set (empty is unset)."""
    old = LEGACY_NAMES[name]
    value, old_value = env.get(name, "").strip(), env.get(old, "").strip()
    if old_value:
        legacy.append(name)
        if value and value != old_value:
            raise OffloadVLLMConfigError(
                f"{name}={value!r} and {old}={old_value!r} (its old name) disagree; "
                f"unset {old}, and set {name} alone"
            )
    if value:
        return name, value
    if old_value:
        return old, old_value
    return None


def read_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Parse and validate the environment. Raises `OffloadVLLMConfigError` naming the bad value.

    Each setting is read from its `OFFLOAD_VLLM_*` name, else its old
    `VLLM_OFFLOAD_*` name (both set: they must agree); the strategy, from neither,
    falls back to offload's `OFFLOAD_STRATEGY`. A message names the variable the
    value came from.
    """
    env = os.environ if environ is None else environ
    unknown = _unknown(env)
    if unknown:
        raise OffloadVLLMConfigError(
            f"unknown setting(s) {', '.join(unknown)}; the offload vLLM adapter reads "
            + ", ".join(KNOWN_ENV)
            + f" (and their old names {', '.join(LEGACY_NAMES.values())})"
        )
    legacy: list[str] = []

    strategy: str | None = None
    source = "unset"
    found = _lookup(env, STRATEGY_ENV, legacy)
    if found is None and env.get(FALLBACK_STRATEGY_ENV, "").strip():
        found = FALLBACK_STRATEGY_ENV, env[FALLBACK_STRATEGY_ENV].strip()
    if found is not None:
        source, strategy = found
        if strategy not in ADAPTER_STRATEGIES:
            raise OffloadVLLMConfigError(
                f"{source}={strategy!r} is not a strategy the vLLM adapter supports; valid: "
                + ", ".join(ADAPTER_STRATEGIES)
            )
        if strategy not in offload.STRATEGIES:
            raise OffloadVLLMConfigError(
                f"{source}={strategy!r}: the installed offload {offload.__version__} does not "
                f"provide this strategy (it has: {', '.join(offload.STRATEGIES)}); "
                "upgrade offload or pick another"
            )

    # OFFLOAD_MAX_WORKERS needs no handling here: offload itself reads it when
    # OFFLOAD_VLLM_WORKERS is unset.
    workers: int | None = None
    found = _lookup(env, WORKERS_ENV, legacy)
    if found is not None:
        name, raw = found
        workers = _parse_workers(name, raw)
        if strategy in (None, "inline", "async-renderer"):
            raise OffloadVLLMConfigError(
                f"{name}={workers} has no effect with "
                + ("no strategy set" if strategy is None else f"strategy {strategy!r} (it has no worker pool)")
                + f"; unset it, or set {STRATEGY_ENV}=thread, process or ray"
            )
    max_queue: int | None = None
    found = _lookup(env, MAX_QUEUE_ENV, legacy)
    if found is not None:
        name, raw = found
        max_queue = _parse_max_queue(name, raw)
        if strategy in (None, "inline"):
            raise OffloadVLLMConfigError(
                f"{name}={max_queue} has no effect with "
                + ("no strategy set" if strategy is None else "strategy 'inline' (it has no queue)")
                + f"; unset it, or set {STRATEGY_ENV}=thread, process, async-renderer or ray"
            )
    ray_address: str | None = None
    found = _lookup(env, RAY_ADDRESS_ENV, legacy)
    if found is not None:
        name, ray_address = found
        if strategy != "ray":
            raise OffloadVLLMConfigError(
                f"{name}={ray_address!r} has no effect with "
                + ("no strategy set" if strategy is None else f"strategy {strategy!r}")
                + f"; unset it, or set {STRATEGY_ENV}=ray"
            )
    return Settings(
        strategy=strategy,
        workers=workers,
        strategy_source=source,
        max_queue=max_queue,
        ray_address=ray_address,
        legacy_names=tuple(legacy),
    )


def _parse_max_queue(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise OffloadVLLMConfigError(
            f"{name}={raw!r} is not an integer; give the number of calls that may wait (>= 0)"
        ) from None
    if value < 0:
        raise OffloadVLLMConfigError(f"{name}={raw!r}: the queue bound must be >= 0")
    return value
