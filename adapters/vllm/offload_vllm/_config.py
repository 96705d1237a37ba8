"""The adapter's settings, read from `OFFLOAD_VLLM_*` (then `OFFLOAD_STRATEGY`) once, at plugin load.

`OPTIONS` is the one list of settings: their variables, the launcher's flags
(`python -m offload_vllm serve --offload-*`) and which strategies each applies
to, which is read from the strategy's placement kind (`_kinds.STRATEGIES`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import offload

from ._kinds import STRATEGIES, StrategyRow
from ._lanes import DEFAULT_LANE, LANE_HEADER, LANE_NAME_CHARACTERS, LaneRouter, is_lane_name
from ._seams.routes import POOLING_PATHS

# `OFFLOAD_VLLM_*`, not `VLLM_*`: vLLM warns about every `VLLM_*` variable it does
# not know, at every start, and refuses them when told to fail hard
# (`Platform.validate_environ`, vllm/platforms/interface.py).
PREFIX = "OFFLOAD_VLLM_"
STRATEGY_ENV = "OFFLOAD_VLLM_STRATEGY"
WORKERS_ENV = "OFFLOAD_VLLM_WORKERS"
MAX_QUEUE_ENV = "OFFLOAD_VLLM_MAX_QUEUE"
MAX_QUEUED_COST_ENV = "OFFLOAD_VLLM_MAX_QUEUED_COST"
SCHEDULING_ENV = "OFFLOAD_VLLM_SCHEDULING"
LANES_ENV = "OFFLOAD_VLLM_LANES"
LANE_ROUTES_ENV = "OFFLOAD_VLLM_LANE_ROUTES"
LANE_HEADER_ENV = "OFFLOAD_VLLM_LANE_HEADER"
MAX_REQUEST_COST_ENV = "OFFLOAD_VLLM_MAX_REQUEST_COST"
ENGINE_PRIORITY_ENV = "OFFLOAD_VLLM_ENGINE_PRIORITY"
RAY_ADDRESS_ENV = "OFFLOAD_VLLM_RAY_ADDRESS"
WORKER_NICE_ENV = "OFFLOAD_VLLM_WORKER_NICE"
INLINE_COST_ENV = "OFFLOAD_VLLM_INLINE_COST"
EXPRESS_COST_ENV = "OFFLOAD_VLLM_EXPRESS_COST"
VALIDATION_SHORTCUT_ENV = "OFFLOAD_VLLM_VALIDATION_SHORTCUT"
HEALTH_PORT_ENV = "OFFLOAD_VLLM_HEALTH_PORT"
HEALTH_MAX_STALL_ENV = "OFFLOAD_VLLM_HEALTH_MAX_STALL"
FALLBACK_STRATEGY_ENV = "OFFLOAD_STRATEGY"
# ---- tokenization settings (prefix tokenization, cross-request batching) ----
PREFIX_TOKENIZE_ENV = "OFFLOAD_VLLM_PREFIX_TOKENIZE"
BATCH_ACROSS_REQUESTS_ENV = "OFFLOAD_VLLM_BATCH_ACROSS_REQUESTS"
BATCH_WAIT_ENV = "OFFLOAD_VLLM_BATCH_WAIT"
#: async-renderer's default batching window, spent only while other requests
#: are in flight (`_seams.admission.RequestsInFlight`); see docs/strategies/async-renderer.md.
#: Why: docs/decisions/0005-batch-window-10-ms.md
DEFAULT_BATCH_WAIT_S = 0.01
# ---- end of tokenization settings ----

#: The names the adapter knows how to wire into vLLM.
ADAPTER_STRATEGIES = tuple(STRATEGIES)

#: Calls priced at most this run on the event loop (`OFFLOAD_VLLM_INLINE_COST`).
#: Why: docs/decisions/0002-small-calls-on-the-loop-inline-cost-1024.md
DEFAULT_INLINE_COST = 1024.0

#: `thread` and `process`: the express worker takes calls priced at most this
#: (`OFFLOAD_VLLM_EXPRESS_COST`): two pieces (`_cost.PIECE_COST`), which a
#: one-image request fits since every image is priced its fixed decoding cost,
#: and, as the strategy rules, at most a quarter of the costliest call running.
#: Why: docs/decisions/0003-express-worker-one-piece-and-a-quarter.md
DEFAULT_EXPRESS_COST = 32768.0

#: Seconds the event loop may go without turning before the health port's
#: liveness answers 503 (`OFFLOAD_VLLM_HEALTH_MAX_STALL`): far above any stall
#: offload leaves on the loop (milliseconds), and above the 4.8 s a single 5 MB
#: request froze vLLM's own `/health` for (vLLM issue 24910), which a loop
#: without offload may still do once; a loop stuck longer serves nobody.
DEFAULT_HEALTH_MAX_STALL_S = 5.0

SCHEDULING = ("fair", "fifo")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class OffloadVLLMConfigError(offload.ConfigError):
    """An `OFFLOAD_VLLM_*`/`OFFLOAD_*` setting is invalid; raised at plugin load."""


# ---- one parser per setting --------------------------------------------------


def _parse_workers(name: str, raw: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise OffloadVLLMConfigError(f"{name}={raw!r} is not an integer; give a worker count >= 1") from None
    if value < 1:
        raise OffloadVLLMConfigError(f"{name}={raw!r}: the worker count must be >= 1")
    return value


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


def _parse_positive(name: str, raw: str, what: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise OffloadVLLMConfigError(f"{name}={raw!r} is not a number; give {what} (> 0)") from None
    if not 0 < value < math.inf:
        raise OffloadVLLMConfigError(f"{name}={raw!r}: {what} must be a finite number > 0")
    return value


def _parse_max_queued_cost(name: str, raw: str) -> float:
    return _parse_positive(name, raw, "the cost that may be queued, in characters")


def _parse_scheduling(name: str, raw: str) -> str:
    if raw not in SCHEDULING:
        raise OffloadVLLMConfigError(f"{name}={raw!r} is not a scheduling; valid: {', '.join(SCHEDULING)}")
    return raw


def _pairs(name: str, raw: str, shape: str) -> list[tuple[str, str]]:
    """`a=b,c=d` as `[(a, b), (c, d)]`, each part stripped; refused unless every
    item has both parts and no left-hand side repeats."""
    pairs: list[tuple[str, str]] = []
    for item in raw.split(","):
        left, sep, right = item.partition("=")
        left, right = left.strip(), right.strip()
        if not sep or not left or not right:
            raise OffloadVLLMConfigError(f"{name}={raw!r}: {item.strip()!r} is not {shape}; give {shape},...")
        if left in dict(pairs):
            raise OffloadVLLMConfigError(f"{name}={raw!r}: {left} is given twice")
        pairs.append((left, right))
    return pairs


def _parse_max_request_cost(name: str, raw: str) -> float:
    return _parse_positive(name, raw, "the cost one request may have, in characters")


def _check_lane_name(name: str, raw: str, lane: str) -> None:
    if not is_lane_name(lane):
        raise OffloadVLLMConfigError(
            f"{name}={raw!r}: {lane!r} is not a lane name; a lane name is made of {LANE_NAME_CHARACTERS} "
            f"(an HTTP token, so that the {LANE_HEADER} header can name it)"
        )


def _parse_lanes(name: str, raw: str) -> tuple[tuple[str, float], ...]:
    lanes = []
    for lane, weight in _pairs(name, raw, "LANE=WEIGHT"):
        _check_lane_name(name, raw, lane)
        lanes.append((lane, _parse_positive(name, weight, f"the weight of lane {lane!r}")))
    # The executor's own check of names and weights, so that what passes here starts.
    try:
        offload.strategy.Lanes(dict(lanes), setting=f"{name}={raw!r}")
    except offload.ConfigError as exc:
        raise OffloadVLLMConfigError(str(exc)) from None
    return tuple(lanes)


#: `OFFLOAD_VLLM_LANE_HEADER`'s words: every lane may be named, or none.
LANE_HEADER_ON = "on"
LANE_HEADER_OFF = "off"


def _parse_lane_header(name: str, raw: str) -> tuple[str, ...] | None:
    """`None` (`on`: every lane), `()` (`off`: the header is ignored), or the lanes a header may name."""
    if raw == LANE_HEADER_ON:
        return None
    if raw == LANE_HEADER_OFF:
        return ()
    lanes: list[str] = []
    for item in raw.split(","):
        lane = item.strip()
        if not lane:
            raise OffloadVLLMConfigError(
                f"{name}={raw!r}: give {LANE_HEADER_ON}, {LANE_HEADER_OFF} or a list of lanes LANE,..."
            )
        _check_lane_name(name, raw, lane)
        if lane in lanes:
            raise OffloadVLLMConfigError(f"{name}={raw!r}: {lane} is given twice")
        lanes.append(lane)
    return tuple(lanes)


def _parse_lane_routes(name: str, raw: str) -> tuple[tuple[str, str], ...]:
    routes = _pairs(name, raw, "ROUTE=LANE")
    for route, _ in routes:
        if route not in POOLING_PATHS:
            raise OffloadVLLMConfigError(
                f"{name}={raw!r}: {route} is not a pooling route; valid: {', '.join(sorted(POOLING_PATHS))}"
            )
    return tuple(routes)


def _cost_bound(zero_means: str) -> Callable[[str, str], float]:
    """A parser for a bound in the cost unit: a finite number >= 0."""

    def parse(name: str, raw: str) -> float:
        value = _number(raw)
        if not 0 <= value < math.inf:
            raise OffloadVLLMConfigError(
                f"{name}={raw!r} is not a cost; give a number of characters >= 0 (0: {zero_means})"
            )
        return value

    return parse


_parse_inline_cost = _cost_bound("every call on the executor")
_parse_express_cost = _cost_bound("no express worker")


def _parse_nice(name: str, raw: str) -> int:
    if not (raw.isascii() and raw.isdigit()) or int(raw) > 19:
        raise OffloadVLLMConfigError(f"{name}={raw!r} is not a niceness increment; give an integer from 0 to 19")
    return int(raw)


def _parse_switch(name: str, raw: str) -> bool:
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise OffloadVLLMConfigError(f"{name}={raw!r} is not a switch; give 1 or 0 (true/false, yes/no, on/off)")


def _number(raw: str) -> float:
    """`raw` as a float; NaN (outside every range) when it is not a number."""
    try:
        return float(raw)
    except ValueError:
        return math.nan


def _parse_batch_wait(name: str, raw: str) -> float:
    seconds = _number(raw)
    if not 0 <= seconds <= 1:
        raise OffloadVLLMConfigError(f"{name}={raw!r} is not a wait; give seconds from 0 to 1, such as 0.002")
    return seconds


def _parse_port(name: str, raw: str) -> int:
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= 65535:
        raise OffloadVLLMConfigError(f"{name}={raw!r} is not a port; give a TCP port number from 1 to 65535")
    return int(raw)


def _parse_max_stall(name: str, raw: str) -> float:
    return _parse_positive(name, raw, "the seconds the event loop may go without turning")


def _parse_text(name: str, raw: str) -> str:
    return raw


@dataclass(frozen=True)
class Option:
    """One setting: its variable, its launcher flag, and where it applies."""

    env: str
    flag: str
    #: The flag's value in the usage line; `None` for a switch (`--flag` alone sets it).
    metavar: str | None
    #: `parse(variable, value)`: the value, or `OffloadVLLMConfigError` naming both.
    parse: Callable[[str, str], Any]
    #: The strategies it applies to, by their row; `None`: every strategy.
    applies: Callable[[StrategyRow], bool] | None = None
    #: Why a strategy it does not apply to ignores it ("it has no queue").
    lacking: str = ""

    def applies_to(self, strategy: str) -> bool:
        return self.applies is None or self.applies(STRATEGIES[strategy])

    def usage(self) -> str:
        return f"[{self.flag}]" if self.metavar is None else f"[{self.flag} {self.metavar}]"


def _has_pool(row: StrategyRow) -> bool:
    return row.kind.pool


def _has_queue(row: StrategyRow) -> bool:
    return row.kind.queue


def _takes_ray_address(row: StrategyRow) -> bool:
    return "ray_address" in row.own_options


def _takes_worker_nice(row: StrategyRow) -> bool:
    return "worker_nice" in row.own_options


def _takes_express_cost(row: StrategyRow) -> bool:
    return "express_cost" in row.own_options


# ---- tokenization settings (prefix tokenization, cross-request batching) ----
def _batches(row: StrategyRow) -> bool:
    return row.kind.batches


_TOKENIZATION_OPTIONS = (
    Option(PREFIX_TOKENIZE_ENV, "--offload-prefix-tokenize", "1|0", _parse_switch),
    Option(
        BATCH_ACROSS_REQUESTS_ENV, "--offload-batch-across-requests", "1|0", _parse_switch, _batches,
        "it does not batch tokenization",
    ),
    Option(
        BATCH_WAIT_ENV, "--offload-batch-wait", "SECONDS", _parse_batch_wait, _batches,
        "it does not batch tokenization",
    ),
)
# ---- end of tokenization settings ----


#: Every setting, in the order messages and the usage line list them.
OPTIONS = (
    # The strategy is read first, and on its own (it falls back to OFFLOAD_STRATEGY).
    Option(STRATEGY_ENV, "--offload-strategy", "S", _parse_text),
    Option(WORKERS_ENV, "--offload-workers", "N", _parse_workers, _has_pool, "it has no worker pool"),
    Option(MAX_QUEUE_ENV, "--offload-max-queue", "Q", _parse_max_queue, _has_queue, "it has no queue"),
    Option(
        MAX_QUEUED_COST_ENV, "--offload-max-queued-cost", "C", _parse_max_queued_cost, _has_queue, "it has no queue"
    ),
    Option(SCHEDULING_ENV, "--offload-scheduling", "fair|fifo", _parse_scheduling, _has_queue, "it has no queue"),
    Option(LANES_ENV, "--offload-lanes", "LANE=WEIGHT,...", _parse_lanes, _has_queue, "it has no queue"),
    Option(
        LANE_ROUTES_ENV, "--offload-lane-routes", "ROUTE=LANE,...", _parse_lane_routes, _has_queue, "it has no queue"
    ),
    Option(
        LANE_HEADER_ENV, "--offload-lane-header", "on|off|LANE,...", _parse_lane_header, _has_queue, "it has no queue"
    ),
    Option(MAX_REQUEST_COST_ENV, "--offload-max-request-cost", "C", _parse_max_request_cost),
    Option(ENGINE_PRIORITY_ENV, "--offload-engine-priority", None, _parse_switch),
    Option(RAY_ADDRESS_ENV, "--offload-ray-address", "A", _parse_text, _takes_ray_address),
    Option(
        WORKER_NICE_ENV, "--offload-worker-nice", "N", _parse_nice, _takes_worker_nice,
        "it starts no worker threads or processes of its own on this host",
    ),
    Option(INLINE_COST_ENV, "--offload-inline-cost", "C", _parse_inline_cost, _has_pool, "it has no worker pool"),
    Option(
        EXPRESS_COST_ENV, "--offload-express-cost", "C", _parse_express_cost, _takes_express_cost,
        "it has no express worker (thread and process have one)",
    ),
    Option(VALIDATION_SHORTCUT_ENV, "--offload-validation-shortcut", "1|0", _parse_switch),
    Option(HEALTH_PORT_ENV, "--offload-health-port", "PORT", _parse_port),
    Option(HEALTH_MAX_STALL_ENV, "--offload-health-max-stall", "SECONDS", _parse_max_stall),
    *_TOKENIZATION_OPTIONS,
)

#: Every variable this adapter reads; any other `OFFLOAD_VLLM_*` is a typo and refused.
KNOWN_ENV = tuple(option.env for option in OPTIONS)

#: The name the first settings had (`VLLM_OFFLOAD_*`): still read, with a
#: warning naming the new one. Any other `VLLM_OFFLOAD_*` is refused too.
LEGACY_PREFIX = "VLLM_OFFLOAD_"
LEGACY_NAMES = {
    name: LEGACY_PREFIX + name.removeprefix(PREFIX)
    for name in (STRATEGY_ENV, WORKERS_ENV, MAX_QUEUE_ENV, RAY_ADDRESS_ENV)
}


@dataclass(frozen=True)
class Settings:
    """What the plugin applies. `strategy=None` leaves vLLM's own behaviour untouched.

    Two settings are equal when they apply the same thing, whichever variables
    they were read from (`strategy_source`, `legacy_names`).
    """

    strategy: str | None
    workers: int | None
    strategy_source: str = field(compare=False)
    #: Requests that may wait for a worker (one place each, held until the
    #: response is built); past it, requests get HTTP 503.
    max_queue: int | None = None
    #: Cost (characters, `_cost.py`) that may be admitted and not started; past it, HTTP 503.
    max_queued_cost: float | None = None
    #: `"fair"` (lanes by weight, requests by cost) or `"fifo"`.
    scheduling: str = "fair"
    #: Lanes and their weights, besides `"default"` (weight 1 unless given).
    lanes: tuple[tuple[str, float], ...] = ()
    #: Route -> lane, for requests that do not name their lane in a header.
    lane_routes: tuple[tuple[str, str], ...] = ()
    #: The lanes a request may name in the `X-Offload-Lane` header: `None`,
    #: every lane; `()`, none (the header is ignored).
    lane_header: tuple[str, ...] | None = None
    #: A request costlier than this (characters, `_cost.py`) is answered HTTP 413.
    max_request_cost: float | None = None
    #: Give each request an engine priority from its cost and lane.
    engine_priority: bool = False
    #: The Ray cluster the `ray` strategy joins (`None`: `RAY_ADDRESS`, else a local instance).
    ray_address: str | None = None
    #: `thread` and `process` workers' niceness increment (`None`: the strategy's default, 10).
    worker_nice: int | None = None
    #: Calls priced at most this (characters, `_cost.py`) run on the event loop
    #: instead of on a worker; `None`: `DEFAULT_INLINE_COST` where there is a pool.
    inline_cost_setting: float | None = None
    #: `thread` and `process`: one more worker runs only calls priced at most
    #: this (and a quarter of the costliest running), at the loop's priority
    #: (the strategy's `express_cost`); `None`: `DEFAULT_EXPRESS_COST`.
    express_cost_setting: float | None = None
    #: `/v1/embeddings` validates a body without the chat-input models a value
    #: in its `input` rules out (`_seams/validation.py`).
    #: Why on: docs/decisions/0007-validation-shortcut-on-by-default.md
    validation_shortcut: bool = True
    #: The port of the health endpoints served off the event loop (`_health.py`); `None`: none.
    health_port: int | None = None
    #: Seconds the loop may go without turning before liveness fails.
    health_max_stall: float = DEFAULT_HEALTH_MAX_STALL_S
    # ---- tokenization settings (prefix tokenization, cross-request batching) ----
    #: Tokenize only the part of a truncated text prompt its kept tokens need (`_prefix.py`).
    #: Why on: docs/decisions/0006-prefix-tokenization-on-by-default.md
    prefix_tokenize: bool = True
    #: `async-renderer`: calls of different requests with equal parameters share a tokenizer call.
    batch_across_requests: bool = True
    #: `async-renderer`: seconds a tokenizer batch that is not full waits for more
    #: calls while other requests are in flight (the strategy's `max_wait`); `None`:
    #: the adapter's default (`batch_window`).
    batch_wait: float | None = None
    # ---- end of tokenization settings ----
    #: The settings (by their `OFFLOAD_VLLM_*` names) given under their old name.
    legacy_names: tuple[str, ...] = field(default=(), compare=False)

    @property
    def row(self) -> StrategyRow:
        """The strategy's row of `_kinds.STRATEGIES` (a strategy must be set)."""
        if self.strategy is None:
            raise ValueError("no strategy is set")
        return STRATEGIES[self.strategy]

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

    def summary(self) -> str:
        """What is applied, in one line (the start-up logs)."""
        parts = [
            f"strategy={self.strategy or '(vLLM default)'}",
            f"workers={self.workers or 'default'}",
            f"max_queue={'unbounded' if self.max_queue is None else self.max_queue}",
            f"max_queued_cost={'unbounded' if self.max_queued_cost is None else f'{self.max_queued_cost:g}'}",
            f"scheduling={self.scheduling}",
        ]
        if self.lanes:
            parts.append("lanes=" + ",".join(f"{name}={weight:g}" for name, weight in self.lanes))
        if self.lane_routes:
            parts.append("lane_routes=" + ",".join(f"{route}={lane}" for route, lane in self.lane_routes))
        if self.lane_header is not None:
            parts.append("lane_header=" + (",".join(self.lane_header) or LANE_HEADER_OFF))
        if self.max_request_cost is not None:
            parts.append(f"max_request_cost={self.max_request_cost:g}")
        if self.engine_priority:
            parts.append("engine_priority=on")
        if not self.validation_shortcut:
            parts.append("validation_shortcut=off")
        if self.health_port is not None:
            parts.append(f"health_port={self.health_port} health_max_stall={self.health_max_stall:g}s")
        if not self.prefix_tokenize:
            parts.append("prefix_tokenize=off")
        if not self.batch_across_requests:
            parts.append("batch_across_requests=off")
        if self.batch_wait is not None:
            parts.append(f"batch_wait={self.batch_wait:g}s")
        if self.inline_cost_setting is not None:
            parts.append(f"inline_cost={self.inline_cost_setting:g}")
        if self.express_cost_setting is not None:
            parts.append(f"express_cost={self.express_cost_setting:g}")
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
    value = env.get(name, "").strip()
    old = LEGACY_NAMES.get(name)
    old_value = "" if old is None else env.get(old, "").strip()
    if old is not None and old_value:
        legacy.append(name)
        if value and value != old_value:
            raise OffloadVLLMConfigError(
                f"{name}={value!r} and {old}={old_value!r} (its old name) disagree; "
                f"unset {old}, and set {name} alone"
            )
    if value:
        return name, value
    if old is not None and old_value:
        return old, old_value
    return None


def _or_list(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _check_applies(option: Option, strategy: str | None, name: str, shown: str) -> None:
    if strategy is not None and option.applies_to(strategy):
        return
    valid = [s for s in ADAPTER_STRATEGIES if option.applies_to(s)]
    if strategy is None:
        why = "no strategy set"
    else:
        why = f"strategy {strategy!r}" + (f" ({option.lacking})" if option.lacking else "")
    raise OffloadVLLMConfigError(
        f"{name}={shown} has no effect with {why}; unset it, or set {STRATEGY_ENV}={_or_list(valid)}"
    )


def read_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Parse and validate the environment. Raises `OffloadVLLMConfigError` naming the bad value.

    Each setting is read from its `OFFLOAD_VLLM_*` name, else its old
    `VLLM_OFFLOAD_*` name where it has one (both set: they must agree); the
    strategy, from neither, falls back to offload's `OFFLOAD_STRATEGY`. A
    message names the variable the value came from. A setting that does not
    apply to the strategy (`OPTIONS`) is refused.
    """
    env = os.environ if environ is None else environ
    unknown = _unknown(env)
    if unknown:
        raise OffloadVLLMConfigError(
            f"unknown setting(s) {', '.join(unknown)}; the offload vLLM adapter reads "
            + ", ".join(KNOWN_ENV)
            + f" (and the old names {', '.join(LEGACY_NAMES.values())})"
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
    values: dict[str, Any] = {}
    for option in OPTIONS[1:]:
        found = _lookup(env, option.env, legacy)
        if found is None:
            continue
        name, raw = found
        value = option.parse(name, raw)
        shown = repr(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else repr(raw)
        _check_applies(option, strategy, name, shown)
        values[option.env] = value

    if HEALTH_MAX_STALL_ENV in values and HEALTH_PORT_ENV not in values:
        raise OffloadVLLMConfigError(
            f"{HEALTH_MAX_STALL_ENV} has no effect without {HEALTH_PORT_ENV}; set the health port, or unset it"
        )
    lanes: tuple[tuple[str, float], ...] = values.get(LANES_ENV, ())
    lane_routes: tuple[tuple[str, str], ...] = values.get(LANE_ROUTES_ENV, ())
    known_lanes = {DEFAULT_LANE, *dict(lanes)}
    for route, lane in lane_routes:
        if lane not in known_lanes:
            raise OffloadVLLMConfigError(
                f"{LANE_ROUTES_ENV}: route {route} names lane {lane!r}, which is not a lane; "
                f"the lanes are {', '.join(sorted(known_lanes))} (add lanes with {LANES_ENV})"
            )
    lane_header: tuple[str, ...] | None = values.get(LANE_HEADER_ENV)
    for lane in lane_header or ():
        if lane not in known_lanes:
            raise OffloadVLLMConfigError(
                f"{LANE_HEADER_ENV}: {lane!r} is not a lane; "
                f"the lanes are {', '.join(sorted(known_lanes))} (add lanes with {LANES_ENV})"
            )
    return Settings(
        strategy=strategy,
        workers=values.get(WORKERS_ENV),
        strategy_source=source,
        max_queue=values.get(MAX_QUEUE_ENV),
        max_queued_cost=values.get(MAX_QUEUED_COST_ENV),
        scheduling=values.get(SCHEDULING_ENV, "fair"),
        lanes=lanes,
        lane_routes=lane_routes,
        lane_header=lane_header,
        max_request_cost=values.get(MAX_REQUEST_COST_ENV),
        engine_priority=values.get(ENGINE_PRIORITY_ENV, False),
        ray_address=values.get(RAY_ADDRESS_ENV),
        worker_nice=values.get(WORKER_NICE_ENV),
        inline_cost_setting=values.get(INLINE_COST_ENV),
        express_cost_setting=values.get(EXPRESS_COST_ENV),
        validation_shortcut=values.get(VALIDATION_SHORTCUT_ENV, True),
        health_port=values.get(HEALTH_PORT_ENV),
        health_max_stall=values.get(HEALTH_MAX_STALL_ENV, DEFAULT_HEALTH_MAX_STALL_S),
        prefix_tokenize=values.get(PREFIX_TOKENIZE_ENV, True),
        batch_across_requests=values.get(BATCH_ACROSS_REQUESTS_ENV, True),
        batch_wait=values.get(BATCH_WAIT_ENV),
        legacy_names=tuple(legacy),
    )
