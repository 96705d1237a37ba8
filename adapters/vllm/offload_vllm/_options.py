"""The adapter's settings, one row each: `OPTIONS`.

A row (`Option`) holds a setting's name (from which its variable
`OFFLOAD_VLLM_<NAME>` and its launcher flag `--offload-<name>` are made), its
parser (`_parsers.py`), the `Settings` field it fills, which strategies it
applies to (read from the strategy's placement kind, `_kinds.STRATEGY_ROWS`),
and its one-line doc. Everything else is read from the table:
`read_settings` and `Settings.summary` (`_config.py`), the launcher's flags
and `serve --help` (`__main__.py`), and the settings tables of docs/vllm.md
(checked against it by `tests/vllm/test_config.py`). This module imports no
vLLM: the launcher checks settings before vLLM loads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import _parsers as parse
from ._kinds import STRATEGY_ROWS, StrategyRow

# `OFFLOAD_VLLM_*`, not `VLLM_*`: vLLM warns about every `VLLM_*` variable it does
# not know, at every start, and refuses them when told to fail hard
# (`Platform.validate_environ`, vllm/platforms/interface.py).
PREFIX = "OFFLOAD_VLLM_"

#: The names the adapter knows how to wire into vLLM.
ADAPTER_STRATEGIES = tuple(STRATEGY_ROWS)

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

#: async-renderer's default batching window, spent only while other requests
#: are in flight (`_door.RequestsInFlight`); see docs/strategies/async-renderer.md.
#: Why: docs/decisions/0005-batch-window-10-ms.md
DEFAULT_BATCH_WAIT_S = 0.01

_SWITCH_VALUES = "switch: `1`/`true`/`yes`/`on`, `0`/`false`/`no`/`off`"
_COST_VALUES = "number ≥ 0, in characters ([costs](#costs-flows-and-lanes))"


@dataclass(frozen=True)
class Option:
    """One setting: a row of `OPTIONS`."""

    #: `OFFLOAD_VLLM_<NAME>`, `--offload-<name>`, and its key in the summary.
    name: str
    parse: parse.Parser
    #: What it does, in one line (`serve --help`).
    doc: str
    #: docs/vllm.md's "Values" and "Default" columns.
    values: str
    default: str
    #: The flag's value in the usage line; `None` for a switch (`--flag` alone sets it).
    metavar: str | None = "V"
    #: The strategies it applies to, by their row; `None`: every strategy.
    applies: Callable[[StrategyRow], bool] | None = None
    #: Why a strategy it does not apply to ignores it ("it has no queue").
    lacking: str = ""
    #: Taken with no strategy set too: it adds to vLLM's server without changing
    #: how a request is served (the health port), so vLLM keeps its own behaviour.
    without_strategy: bool = False
    #: Another setting (its name) without which it has no effect.
    needs: str | None = None
    #: The `Settings` field it fills (default: `name`).
    field: str = ""
    #: In the start-up summary even when left at its default; `unset` shows `None`.
    always_shown: bool = False
    unset: str = ""
    unit: str = ""

    @property
    def env(self) -> str:
        return PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return "--offload-" + self.name.replace("_", "-")

    @property
    def attribute(self) -> str:
        return self.field or self.name

    def applies_to(self, strategy: str) -> bool:
        return self.applies is None or self.applies(STRATEGY_ROWS[strategy])

    def usage(self) -> str:
        return f"[{self.flag}]" if self.metavar is None else f"[{self.flag} {self.metavar}]"

    def refusal(self) -> str:
        """Where it is refused, in words (docs/vllm.md ends its row with this)."""
        if self.needs is not None:
            return f"Refused without `{PREFIX}{self.needs.upper()}`."
        if self.name == "strategy":
            return ""
        others = [f"`{s}`" for s in ADAPTER_STRATEGIES if not self.applies_to(s)]
        if not self.without_strategy:
            others.append("no strategy")
        return f"Refused with {or_list(others)}." if others else ""


def _has_pool(row: StrategyRow) -> bool:
    return row.kind.pool


def _has_queue(row: StrategyRow) -> bool:
    return row.kind.queue


def _batches(row: StrategyRow) -> bool:
    return row.kind.batches


def _own(option: str) -> Callable[[StrategyRow], bool]:
    def takes(row: StrategyRow) -> bool:
        return option in row.own_options

    return takes


def _and_list(names: list[str]) -> str:
    """`a`, `a and b`, `a, b and c`."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _taking(test: Callable[[StrategyRow], bool]) -> list[str]:
    """The strategies (from `STRATEGY_ROWS`) whose row passes `test`, for help texts."""
    return [name for name, row in STRATEGY_ROWS.items() if test(row)]


#: Help texts name the strategies from the table, not by hand.
_EXPRESS = _taking(_own("express_cost"))
_NICE = _taking(_own("worker_nice"))
_BATCHING = _and_list(_taking(_batches))

_NO_POOL = "it has no worker pool"
_NO_QUEUE = "it has no queue"
_NO_BATCHES = "it does not batch tokenization"

#: The strategies, as the settings table lists them (from `STRATEGY_ROWS`).
_STRATEGY_VALUES = ", ".join(
    f"`{name}`" + (f" (with {row.needs} installed)" if row.needs else "") for name, row in STRATEGY_ROWS.items()
)

#: Every setting, in the order messages, the usage line and the summary list them.
OPTIONS = (
    # The strategy is read first, and on its own (it falls back to OFFLOAD_STRATEGY).
    Option(
        "strategy", parse.text, "The strategy for the pooling entrypoints (unset: vLLM's own behaviour).",
        _STRATEGY_VALUES, "unset",
        metavar="S", always_shown=True, unset="(vLLM default)",
    ),
    Option(
        "workers", parse.workers, "Worker threads, processes or Ray actors.", "integer ≥ 1",
        "offload's default; with `--api-server-count N`, the host's cores / N (`thread`, `process`)",
        metavar="N", applies=_has_pool, lacking=_NO_POOL, always_shown=True, unset="default",
    ),
    Option(
        "max_queue", parse.integer(0, None, "an integer", "the number of requests that may wait, an integer >= 0"),
        "Requests that may wait for a worker; past it, HTTP 503 + Retry-After.", "integer ≥ 0", "unset (unbounded)",
        metavar="Q", always_shown=True, unset="unbounded", applies=_has_queue, lacking=_NO_QUEUE,
    ),
    Option(
        "max_queued_cost", parse.positive("the cost that may be queued, in characters"),
        "Cost (characters) of requests admitted and not yet answered; past it, HTTP 503 + Retry-After.",
        "number > 0, in characters ([costs](#costs-flows-and-lanes))", "unset (unbounded)",
        metavar="C", always_shown=True, unset="unbounded", applies=_has_queue, lacking=_NO_QUEUE,
    ),
    Option(
        "scheduling", parse.scheduling, "fair: lanes by weight, requests by cost; fifo: arrival order.",
        "`fair`, `fifo`", "`fair`", metavar="fair|fifo", always_shown=True, applies=_has_queue, lacking=_NO_QUEUE,
    ),
    Option(
        "lanes", parse.lanes, "Lanes and their weights, besides default (weight 1 unless given).",
        "`LANE=WEIGHT,...`, e.g. `query=4,ingest=1`", "unset: the lane `default` alone",
        metavar="LANE=WEIGHT,...", applies=_has_queue, lacking=_NO_QUEUE,
    ),
    Option(
        "lane_routes", parse.lane_routes, "The lane of each pooling route's requests that name none.",
        "`ROUTE=LANE,...`, e.g. `/v1/embeddings=query,/score=ingest`", "unset: every route to `default`",
        metavar="ROUTE=LANE,...", applies=_has_queue, lacking=_NO_QUEUE,
    ),
    Option(
        "lane_header", parse.lane_header, "Which lanes a request may name in its X-Offload-Lane header.",
        "`on`, `off`, or `LANE,...` (configured lanes, `default` included)", "`on`",
        metavar="on|off|LANE,...", applies=_has_queue, lacking=_NO_QUEUE,
    ),
    Option(
        "max_request_cost", parse.positive("the cost one request may have, in characters"),
        "A request costlier than this (characters) is answered HTTP 413.",
        "number > 0, in characters ([costs](#costs-flows-and-lanes))", "unset (no cap)", metavar="C",
    ),
    Option(
        "engine_priority", parse.switch, "Give each request an engine priority from its cost and lane.",
        _SWITCH_VALUES, "off", metavar=None,
    ),
    Option(
        "ray_address", parse.text, "The Ray cluster the ray strategy's actors run on.",
        "`auto`, `ray://host:port`, `host:port`", "unset: `RAY_ADDRESS`, else a local Ray instance",
        metavar="A", applies=_own("ray_address"),
    ),
    Option(
        "worker_nice", parse.integer(0, 19, "a niceness increment", "an integer from 0 to 19"),
        f"The {_and_list(_NICE)} workers' niceness increment.", "integer 0-19",
        "unset: 10 (the strategies' default)", metavar="N", applies=_own("worker_nice"),
        lacking="it starts no worker threads or processes of its own on this host",
    ),
    Option(
        "inline_cost", parse.cost_bound("every call on the executor"),
        "Calls priced at most this (characters) run on the event loop.", _COST_VALUES, "unset: 1024",
        metavar="C", applies=_has_pool, lacking=_NO_POOL, field="inline_cost_setting",
    ),
    Option(
        "express_cost", parse.cost_bound("no express worker"),
        "The express worker takes calls priced at most this (characters); 0: none.", _COST_VALUES,
        f"unset: 32768 (two pieces) with {_and_list([f'`{n}`' for n in _EXPRESS])}", metavar="C", applies=_own("express_cost"),
        lacking=f"it has no express worker ({_and_list(_EXPRESS)} have one)", field="express_cost_setting",
    ),
    Option(
        "validation_shortcut", parse.switch,
        "/v1/embeddings validates a body without the chat-input models its input rules out.",
        _SWITCH_VALUES, "on", metavar="1|0",
    ),
    Option(
        "health_port", parse.integer(1, 65535, "a port", "a TCP port number from 1 to 65535"),
        "Serve liveness and readiness on this port, off the event loop.", "TCP port 1-65535",
        "unset (no health port)", metavar="PORT", without_strategy=True,
    ),
    Option(
        "health_max_stall", parse.positive("the seconds the event loop may go without turning"),
        "Seconds the event loop may go without turning before liveness fails.", "seconds > 0", "5",
        metavar="SECONDS", needs="health_port", always_shown=True, unit="s", without_strategy=True,
    ),
    Option(
        "prefix_tokenize", parse.switch, "Tokenize a truncated text prompt only as far as its kept tokens need.",
        _SWITCH_VALUES, "on", metavar="1|0",
    ),
    Option(
        "batch_across_requests", parse.switch,
        f"{_BATCHING}: concurrent requests' prompts share one tokenizer call.", "same", "on",
        metavar="1|0", applies=_batches, lacking=_NO_BATCHES,
    ),
    Option(
        "batch_wait", parse.batch_wait,
        f"{_BATCHING}: seconds a tokenizer batch waits for more calls while others are in flight.",
        "seconds, 0 to 1", "`0.01`", metavar="SECONDS", applies=_batches, lacking=_NO_BATCHES, unit="s",
    ),
)

#: The rows by name.
BY_NAME = {option.name: option for option in OPTIONS}
STRATEGY_ENV = BY_NAME["strategy"].env
ENGINE_PRIORITY_ENV = BY_NAME["engine_priority"].env
HEALTH_PORT_ENV = BY_NAME["health_port"].env
MAX_REQUEST_COST_ENV = BY_NAME["max_request_cost"].env
LANES_ENV = BY_NAME["lanes"].env

#: Every variable this adapter reads; any other `OFFLOAD_VLLM_*` is a typo and refused.
KNOWN_ENV = tuple(option.env for option in OPTIONS)

#: The deprecation shim: the first settings' old names (`VLLM_OFFLOAD_*`) are
#: still read, with one warning naming the new ones. Any other `VLLM_OFFLOAD_*` is refused.
LEGACY_PREFIX = "VLLM_OFFLOAD_"
LEGACY_NAMES = {
    BY_NAME[name].env: LEGACY_PREFIX + name.upper() for name in ("strategy", "workers", "max_queue", "ray_address")
}




def or_list(names: list[str]) -> str:
    """`a`, `a or b`, `a, b or c`."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
