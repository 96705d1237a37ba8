"""The strategies the adapter supports, and the kind of placement each gets: one table.

A *placement* is where a strategy runs a pooling request's vLLM work
(rendering, post-processing) relative to the vLLM objects that work needs:

- **on the loop** (`inline`): vLLM's own objects, on the event loop;
- **in-thread** (`thread`): worker threads, each with its own copy of the
  renderer's tokenizer (`offload.worker_state`);
- **remote** (`process`, `ray`): workers in other processes, which rebuild the
  renderer, IO processors and serving shells from picklable specs;
- **batched** (`async-renderer`): vLLM's async renderer on the loop, its
  tokenization micro-batched on the strategy's worker.

A built-in strategy's row is derived from the core's table
(`offload.strategy.BUILTIN_STRATEGIES`); a plugin is one row of `PLUGIN_ROWS`.
Everything else is derived from its kind: the settings it takes
(`_options.py`), the executor's options and the calls it makes
(`_placements/`). This module imports no vLLM, so that
settings are checked where vLLM is not loaded (the launcher, `check-seams`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from offload.strategy import BUILTIN_STRATEGIES, BuiltinStrategy


@dataclass(frozen=True)
class PlacementKind:
    """What the settings and the runtime need to know about a kind of placement."""

    #: How messages name it.
    name: str
    #: Calls wait in the executor's queue: `max_queue`, `max_queued_cost`, lanes
    #: and scheduling apply.
    queue: bool
    #: A pool of workers, sized by `OFFLOAD_VLLM_WORKERS`.
    pool: bool
    #: Workers render with renderers of their own, built in another process.
    own_renderers: bool
    #: Tokenization is micro-batched (`OFFLOAD_VLLM_BATCH_ACROSS_REQUESTS` applies).
    batches: bool = False

    def shares_one_renderer(self, workers: int | None) -> bool:
        """Whether every render runs with the one renderer the server built (so
        with its multimodal processor cache, which is neither thread-safe nor
        shareable across processes). `workers=None`: the pool's default size."""
        return not self.own_renderers and (not self.pool or workers == 1)


ON_LOOP = PlacementKind("on the loop", queue=False, pool=False, own_renderers=False)
IN_THREAD = PlacementKind("in-thread", queue=True, pool=True, own_renderers=False)
REMOTE = PlacementKind("remote", queue=True, pool=True, own_renderers=True)
BATCHED = PlacementKind("batched", queue=True, pool=False, own_renderers=False, batches=True)


@dataclass(frozen=True)
class StrategyRow:
    """One strategy the adapter supports."""

    kind: PlacementKind
    #: Settings only this strategy takes: `Settings` field -> executor option.
    own_options: Mapping[str, str] = field(default_factory=dict)
    #: Remote workers retitle their process (`ps` shows `_workers.PROCESS_TITLE`);
    #: False keeps the host's title (Ray's tools show `ray::...`).
    titles_workers: bool = False
    #: What must be installed for it, as the settings table says (`""`: nothing).
    needs: str = ""
    #: Its pool's workers run on the API server's host (threads, child
    #: processes), so with several API server processes each defaults to its
    #: share of the host's cores; a cluster's (Ray's actors) are placed elsewhere.
    workers_on_host: bool = True


def _kind_of(builtin: BuiltinStrategy) -> PlacementKind:
    if builtin.batches:
        return BATCHED
    return {"caller": ON_LOOP, "threads": IN_THREAD, "processes": REMOTE}[builtin.runs_in]


def _builtin_row(builtin: BuiltinStrategy) -> StrategyRow:
    return StrategyRow(
        _kind_of(builtin),
        own_options={"worker_nice": "nice", "express_cost": "express_cost"} if builtin.express else {},
        titles_workers=builtin.runs_in == "processes",
    )


#: Strategies the adapter supports beyond the core's built-ins: plugins, keyed
#: by their entry-point name.
PLUGIN_ROWS: Mapping[str, StrategyRow] = {
    "ray": StrategyRow(
        REMOTE, own_options={"ray_address": "address"}, needs="[offload-ray](ray.md)", workers_on_host=False
    ),
}

#: Every strategy the adapter supports, in the order messages list them: the
#: core's built-ins (`offload.strategy.BUILTIN_STRATEGIES`), then `PLUGIN_ROWS`.
#: A strategy must also be in `offload.STRATEGIES` (`ray` is there once the
#: `offload-ray` plugin is installed).
STRATEGY_ROWS: Mapping[str, StrategyRow] = {
    **{b.name: _builtin_row(b) for b in BUILTIN_STRATEGIES},
    **PLUGIN_ROWS,
}
