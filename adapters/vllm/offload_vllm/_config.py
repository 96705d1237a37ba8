"""The adapter's settings, read from `VLLM_OFFLOAD_*` (then `OFFLOAD_*`) once, at plugin load."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import offload

STRATEGY_ENV = "VLLM_OFFLOAD_STRATEGY"
WORKERS_ENV = "VLLM_OFFLOAD_WORKERS"
MAX_QUEUE_ENV = "VLLM_OFFLOAD_MAX_QUEUE"
RAY_ADDRESS_ENV = "VLLM_OFFLOAD_RAY_ADDRESS"
FALLBACK_STRATEGY_ENV = "OFFLOAD_STRATEGY"

#: Every variable this adapter reads; any other `VLLM_OFFLOAD_*` is a typo and refused.
KNOWN_ENV = (STRATEGY_ENV, WORKERS_ENV, MAX_QUEUE_ENV, RAY_ADDRESS_ENV)

#: The names the adapter knows how to wire into vLLM. A strategy must also be
#: registered in `offload.STRATEGIES` (`ray` is there once the `offload-ray`
#: plugin is installed).
ADAPTER_STRATEGIES = ("inline", "thread", "process", "async-renderer", "ray")

#: Strategies whose workers are other processes: they build their own
#: renderers from the engine's config, once per worker.
SPEC_STRATEGIES = ("process", "ray")


class OffloadVLLMConfigError(offload.ConfigError):
    """A `VLLM_OFFLOAD_*`/`OFFLOAD_*` setting is invalid; raised at plugin load."""


@dataclass(frozen=True)
class Settings:
    """What the plugin applies. `strategy=None` leaves vLLM's own behaviour untouched."""

    strategy: str | None
    workers: int | None
    strategy_source: str
    #: Offloaded calls that may wait for a worker; past it, requests get HTTP 503.
    max_queue: int | None = None
    #: The Ray cluster the `ray` strategy joins (`None`: `RAY_ADDRESS`, else a local instance).
    ray_address: str | None = None


def _parse_workers(name: str, raw: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise OffloadVLLMConfigError(f"{name}={raw!r} is not an integer; give a worker count >= 1") from None
    if value < 1:
        raise OffloadVLLMConfigError(f"{name}={raw!r}: the worker count must be >= 1")
    return value


def read_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Parse and validate the environment. Raises `OffloadVLLMConfigError` naming the bad value."""
    env = os.environ if environ is None else environ
    unknown = sorted(k for k in env if k.startswith("VLLM_OFFLOAD_") and k not in KNOWN_ENV)
    if unknown:
        raise OffloadVLLMConfigError(
            f"unknown setting(s) {', '.join(unknown)}; the offload vLLM adapter reads "
            + ", ".join(KNOWN_ENV)
        )

    strategy: str | None = None
    source = "unset"
    for name in (STRATEGY_ENV, FALLBACK_STRATEGY_ENV):
        raw = env.get(name, "").strip()
        if raw:
            strategy, source = raw, name
            break
    if strategy is not None:
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
    # VLLM_OFFLOAD_WORKERS is unset.
    raw_workers = env.get(WORKERS_ENV, "").strip()
    workers = _parse_workers(WORKERS_ENV, raw_workers) if raw_workers else None
    if workers is not None and strategy in (None, "inline", "async-renderer"):
        raise OffloadVLLMConfigError(
            f"{WORKERS_ENV}={workers} has no effect with "
            + ("no strategy set" if strategy is None else f"strategy {strategy!r} (it has no worker pool)")
            + f"; unset it, or set {STRATEGY_ENV}=thread, process or ray"
        )
    raw_queue = env.get(MAX_QUEUE_ENV, "").strip()
    max_queue = _parse_max_queue(raw_queue) if raw_queue else None
    if max_queue is not None and strategy in (None, "inline"):
        raise OffloadVLLMConfigError(
            f"{MAX_QUEUE_ENV}={max_queue} has no effect with "
            + ("no strategy set" if strategy is None else "strategy 'inline' (it has no queue)")
            + f"; unset it, or set {STRATEGY_ENV}=thread, process, async-renderer or ray"
        )
    ray_address = env.get(RAY_ADDRESS_ENV, "").strip() or None
    if ray_address is not None and strategy != "ray":
        raise OffloadVLLMConfigError(
            f"{RAY_ADDRESS_ENV}={ray_address!r} has no effect with "
            + ("no strategy set" if strategy is None else f"strategy {strategy!r}")
            + f"; unset it, or set {STRATEGY_ENV}=ray"
        )
    return Settings(
        strategy=strategy,
        workers=workers,
        strategy_source=source,
        max_queue=max_queue,
        ray_address=ray_address,
    )


def _parse_max_queue(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise OffloadVLLMConfigError(
            f"{MAX_QUEUE_ENV}={raw!r} is not an integer; give the number of calls that may wait (>= 0)"
        ) from None
    if value < 0:
        raise OffloadVLLMConfigError(f"{MAX_QUEUE_ENV}={raw!r}: the queue bound must be >= 0")
    return value
