"""The built-in strategies, one row each: the one place their names are typed.

The registry (`_registry`) maps these names to their classes; adapters read the
same rows (through `offload.strategy.BUILTIN_STRATEGIES`) to decide what each
strategy needs, rather than keeping lists of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, final


@final
@dataclass(frozen=True)
class BuiltinStrategy:
    """What is known of a built-in strategy without importing it."""

    #: The registry name: what users write, what labels its metrics.
    name: str
    #: `"module:Class"`, imported on first use so that `import offload` stays
    #: light (the process strategy pulls in multiprocessing).
    target: str
    #: Where calls run: on the caller's thread, on worker threads or in
    #: worker processes.
    runs_in: Literal["caller", "threads", "processes"]
    #: A pool of workers, sized by `max_workers`.
    pool: bool
    #: It has an express worker (`express_cost`) and lowers its workers'
    #: priority (`nice`).
    express: bool
    #: Queued calls run as micro-batches (`async-renderer`).
    batches: bool = False


#: Every built-in strategy, in the order messages list them.
BUILTIN_STRATEGIES: tuple[BuiltinStrategy, ...] = (
    BuiltinStrategy(
        "inline", "offload._strategies._inline:InlineStrategy", runs_in="caller", pool=False, express=False
    ),
    BuiltinStrategy(
        "thread", "offload._strategies._thread:ThreadStrategy", runs_in="threads", pool=True, express=True
    ),
    BuiltinStrategy(
        "process", "offload._strategies._process:ProcessStrategy", runs_in="processes", pool=True, express=True
    ),
    # The registry name of `BatchingStrategy`, after vLLM's async renderer.
    BuiltinStrategy(
        "async-renderer",
        "offload._strategies._batching:BatchingStrategy",
        runs_in="threads",
        pool=False,
        express=False,
        batches=True,
    ),
)
