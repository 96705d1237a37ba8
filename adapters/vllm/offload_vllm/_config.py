"""The adapter's settings, read from `OFFLOAD_VLLM_*` (then `OFFLOAD_STRATEGY`) once, at plugin load.

Every setting is a row of `_options.OPTIONS`; this module reads them all the
same way (`read_settings`) into one `Settings`, and shows what it applies in
one line (`Settings.summary`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field, fields
from typing import Any

import offload

from . import _parsers as parse
from ._kinds import STRATEGY_ROWS, StrategyRow
from ._lanes import DEFAULT_LANE, LaneRouter
from ._options import (
    ADAPTER_STRATEGIES,
    BY_NAME,
    DEFAULT_BATCH_WAIT_S,
    DEFAULT_EXPRESS_COST,
    DEFAULT_HEALTH_MAX_STALL_S,
    DEFAULT_INLINE_COST,
    ENGINE_PRIORITY_ENV,
    HEALTH_PORT_ENV,
    KNOWN_ENV,
    LANES_ENV,
    LEGACY_NAMES,
    LEGACY_PREFIX,
    OPTIONS,
    PREFIX,
    STRATEGY_ENV,
    Option,
    or_list,
)
from ._parsers import OffloadVLLMConfigError

FALLBACK_STRATEGY_ENV = "OFFLOAD_STRATEGY"

# Read from here by the rest of the adapter and its tests.
__all__ = [
    "ADAPTER_STRATEGIES",
    "DEFAULT_BATCH_WAIT_S",
    "DEFAULT_EXPRESS_COST",
    "DEFAULT_INLINE_COST",
    "ENGINE_PRIORITY_ENV",
    "HEALTH_PORT_ENV",
    "KNOWN_ENV",
    "LEGACY_NAMES",
    "OPTIONS",
    "OffloadVLLMConfigError",
    "Settings",
    "adopt_new_names",
    "read_settings",
]


@dataclass(frozen=True)
class Settings:
    """What the plugin applies. `strategy=None` leaves vLLM's own behaviour
    untouched (with `health_port`, the health port is served beside it).

    One field per row of `OPTIONS` (its `attribute`), which says what it is.
    Two settings are equal when they apply the same thing, whichever variables
    they were read from (`strategy_source`, and `legacy_names`: the settings,
    by their new names, read under their old ones).
    """

    strategy: str | None
    workers: int | None = None
    strategy_source: str = field(default="unset", compare=False)
    max_queue: int | None = None
    max_queued_cost: float | None = None
    scheduling: str = "fair"
    lanes: tuple[tuple[str, float], ...] = ()
    lane_routes: tuple[tuple[str, str], ...] = ()
    lane_header: tuple[str, ...] | None = None
    max_request_cost: float | None = None
    engine_priority: bool = False
    ray_address: str | None = None
    worker_nice: int | None = None
    inline_cost_setting: float | None = None
    express_cost_setting: float | None = None
    #: Why on: docs/decisions/0007-validation-shortcut-on-by-default.md
    validation_shortcut: bool = True
    health_port: int | None = None
    health_max_stall: float = DEFAULT_HEALTH_MAX_STALL_S
    #: Why on: docs/decisions/0006-prefix-tokenization-on-by-default.md
    prefix_tokenize: bool = True
    batch_across_requests: bool = True
    batch_wait: float | None = None
    legacy_names: tuple[str, ...] = field(default=(), compare=False)

    @property
    def row(self) -> StrategyRow:
        """The strategy's row of `_kinds.STRATEGY_ROWS` (a strategy must be set)."""
        if self.strategy is None:
            raise ValueError("no strategy is set")
        return STRATEGY_ROWS[self.strategy]

    def lane_weights(self) -> dict[str, float]:
        """The executor's `lanes=` option."""
        return dict(self.lanes)

    @property
    def inline_cost(self) -> float:
        """Calls priced at most this run on the event loop: the setting, else
        `DEFAULT_INLINE_COST`, for a strategy with a worker pool; 0 (none) for the others."""
        if self.strategy is None or not self.row.kind.pool:
            return 0.0
        return DEFAULT_INLINE_COST if self.inline_cost_setting is None else self.inline_cost_setting

    @property
    def express_cost(self) -> float:
        """The express worker's bound (the executor's `express_cost`): the
        setting, else `DEFAULT_EXPRESS_COST`, for `thread` and `process`; 0
        (none) for the others."""
        if self.strategy is None or "express_cost" not in self.row.own_options:
            return 0.0
        return DEFAULT_EXPRESS_COST if self.express_cost_setting is None else self.express_cost_setting

    @property
    def batch_window(self) -> float:
        """Seconds a tokenizer batch waits for other requests in flight: the
        setting, else `DEFAULT_BATCH_WAIT_S`, for a strategy that batches; 0 for the others."""
        if self.strategy is None or not self.row.kind.batches:
            return 0.0
        return DEFAULT_BATCH_WAIT_S if self.batch_wait is None else self.batch_wait

    def lane_router(self) -> LaneRouter:
        """How requests are routed to lanes (`"default"` is always a lane)."""
        return LaneRouter.of({DEFAULT_LANE, *dict(self.lanes)}, dict(self.lane_routes), self.lane_header)

    def summary(self, shown: Mapping[str, str] | None = None) -> str:
        """What is applied, in one line (the start-up logs): each setting in
        `OPTIONS`' order that is given, or always shown; with no strategy, the
        strategy and those taken without one alone. `shown`: settings (by
        name) shown with these values, whatever they are (what was started)."""
        shown = shown or {}
        defaults = {f.name: f.default for f in fields(self)}
        parts = []
        for option in OPTIONS:
            if self.strategy is None and option is not OPTIONS[0] and not option.without_strategy:
                continue
            if option.name in shown:
                parts.append(f"{option.name}={shown[option.name]}")
                continue
            value = getattr(self, option.attribute)
            if option.needs is not None and getattr(self, BY_NAME[option.needs].attribute) is None:
                continue
            if option.always_shown or value != defaults[option.attribute]:
                text = option.unset if value is None else _show(value) + option.unit
                parts.append(f"{option.name}={text}")
        return " ".join(parts)

    def legacy_warning(self) -> str | None:
        """The message naming the new name of each old one set, or `None` when none is."""
        if not self.legacy_names:
            return None
        renames = ", ".join(f"{LEGACY_NAMES[name]} -> {name}" for name in self.legacy_names)
        return (
            f"offload-vllm: rename {renames}: the old VLLM_OFFLOAD_* names still work, but vLLM "
            "warns about every VLLM_* variable it does not know (and refuses them when it fails hard)"
        )


def _show(value: Any) -> str:
    """A value as the summary shows it: a switch on/off, a number `:g`, a list `a=b,c`."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        items = [f"{item[0]}={_show(item[1])}" if isinstance(item, tuple) else str(item) for item in value]
        return ",".join(items) or parse.LANE_HEADER_OFF
    return str(value)


def adopt_new_names(settings: Settings, environ: MutableMapping[str, str] | None = None) -> None:
    """Move each setting `settings` read under its old name to its new name in
    `environ` (default `os.environ`), which it was read from: the processes
    started from here on, vLLM's among them, see only `OFFLOAD_VLLM_*` names."""
    env = os.environ if environ is None else environ
    for name in settings.legacy_names:
        env.setdefault(name, env.pop(LEGACY_NAMES[name]))


def _lookup(env: Mapping[str, str], name: str, legacy: list[str]) -> tuple[str, str] | None:
    """`(variable, value)` for the setting `name`, from its name or its old one
    (then `name` is appended to `legacy`), or `None` when neither is set (empty is unset)."""
    value = env.get(name, "").strip()
    old = LEGACY_NAMES.get(name, "")
    old_value = env.get(old, "").strip()
    if old_value:
        legacy.append(name)
        if value and value != old_value:
            raise OffloadVLLMConfigError(
                f"{name}={value!r} and {old}={old_value!r} (its old name) disagree; unset {old}, and set {name} alone"
            )
    return (name, value) if value else (old, old_value) if old_value else None


def _check_applies(option: Option, strategy: str | None, name: str, shown: str) -> None:
    if option.without_strategy if strategy is None else option.applies_to(strategy):
        return
    valid = [s for s in ADAPTER_STRATEGIES if option.applies_to(s)]
    if strategy is None:
        why = "no strategy set"
    else:
        why = f"strategy {strategy!r}" + (f" ({option.lacking})" if option.lacking else "")
    raise OffloadVLLMConfigError(
        f"{name}={shown} has no effect with {why}; unset it, or set {STRATEGY_ENV}={or_list(valid)}"
    )


def _read_strategy(env: Mapping[str, str], legacy: list[str]) -> tuple[str | None, str]:
    """`(strategy, the variable it came from)`; `(None, "unset")` when none is set."""
    found = _lookup(env, STRATEGY_ENV, legacy)
    if found is None and env.get(FALLBACK_STRATEGY_ENV, "").strip():
        found = FALLBACK_STRATEGY_ENV, env[FALLBACK_STRATEGY_ENV].strip()
    if found is None:
        return None, "unset"
    source, strategy = found
    if strategy not in ADAPTER_STRATEGIES:
        raise OffloadVLLMConfigError(
            f"{source}={strategy!r} is not a strategy the vLLM adapter supports; valid: " + ", ".join(ADAPTER_STRATEGIES)
        )
    if strategy not in offload.STRATEGIES:
        raise OffloadVLLMConfigError(
            f"{source}={strategy!r}: the installed offload {offload.__version__} does not "
            f"provide this strategy (it has: {', '.join(offload.STRATEGIES)}); upgrade offload or pick another"
        )
    return strategy, source


def _check_lanes_named(values: Mapping[str, Any]) -> None:
    """The lanes routes and the header name must be lanes."""
    known = {DEFAULT_LANE, *dict(values.get("lanes", ()))}
    named = [(f"{BY_NAME['lane_routes'].env}: route {route} names lane {lane!r}, which", lane)
             for route, lane in values.get("lane_routes", ())]
    named += [(f"{BY_NAME['lane_header'].env}: {lane!r}", lane) for lane in values.get("lane_header") or ()]
    for what, lane in named:
        if lane not in known:
            raise OffloadVLLMConfigError(
                f"{what} is not a lane; the lanes are {', '.join(sorted(known))} (add lanes with {LANES_ENV})"
            )


def read_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Parse and validate the environment. Raises `OffloadVLLMConfigError` naming the bad value.

    Each setting of `OPTIONS` is read from its `OFFLOAD_VLLM_*` name, else its
    old `VLLM_OFFLOAD_*` name where it has one (both set: they must agree); the
    strategy, from neither, falls back to offload's `OFFLOAD_STRATEGY`. A
    message names the variable the value came from. A setting that does not
    apply to the strategy (with no strategy: one not taken without one, all
    but the health port's), or lacks the setting it needs, is refused.
    """
    env = os.environ if environ is None else environ
    unknown = sorted(
        k for k in env
        if (k.startswith(PREFIX) and k not in KNOWN_ENV)
        or (k.startswith(LEGACY_PREFIX) and k not in LEGACY_NAMES.values())
    )
    if unknown:
        raise OffloadVLLMConfigError(
            f"unknown setting(s) {', '.join(unknown)}; the offload vLLM adapter reads "
            + ", ".join(KNOWN_ENV)
            + f" (and the old names {', '.join(LEGACY_NAMES.values())})"
        )
    legacy: list[str] = []
    strategy, source = _read_strategy(env, legacy)
    # OFFLOAD_MAX_WORKERS needs no handling here: offload itself reads it when
    # OFFLOAD_VLLM_WORKERS is unset.
    values: dict[str, Any] = {}
    for option in OPTIONS[1:]:
        found = _lookup(env, option.env, legacy)
        if found is None:
            continue
        name, raw = found
        value = option.parse(name, raw)
        shown = repr(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else repr(raw)
        _check_applies(option, strategy, name, shown)
        values[option.name] = value
    for option in OPTIONS:
        if option.needs is not None and option.name in values and option.needs not in values:
            needed = BY_NAME[option.needs].env
            raise OffloadVLLMConfigError(
                f"{option.env} has no effect without {needed}; set the {option.needs.replace('_', ' ')}, or unset it"
            )
    _check_lanes_named(values)
    return Settings(
        strategy=strategy,
        strategy_source=source,
        legacy_names=tuple(legacy),
        **{BY_NAME[name].attribute: value for name, value in values.items()},
    )
