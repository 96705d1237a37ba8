"""The strategy applied to vLLM: one executor and one placement per server process,
built when vLLM builds its first pooling entrypoint (still at start-up, before
the port opens)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import offload

from ._config import ENGINE_PRIORITY_ENV, OffloadVLLMConfigError, Settings
from ._kinds import StrategyRow
from ._offline import OfflineRenderExecutor
from ._phases import timing_response
from ._placements import Placement, placement_class
from ._seams import config as config_seam
from ._seams.generate import RenderGenerate
from ._seams.io_processor import RenderAll, RenderAsync
from ._seams.multimodal import ProcessMultimodal
from ._seams.serving import PostprocessAsync

logger = logging.getLogger("vllm.offload_vllm")

#: The `loop` label of the API server's loop-lag histogram.
LAG_LOOP_LABEL = "vllm-api-server"


class Runtime:
    """Builds the executor and its placement once, from the settings and the
    served model's config, and answers the seams with the placement's calls."""

    def __init__(self, settings: Settings, in_flight: Callable[[], int] | None = None) -> None:
        """`in_flight`: the server's requests in flight, for a batching
        strategy's window (`_admission.RequestsInFlight`)."""
        if settings.strategy is None:
            raise ValueError("Runtime needs a strategy")
        self.settings = settings
        self._in_flight = in_flight
        self.strategy: str = settings.strategy
        self._placement_class = placement_class(self.strategy)
        self._placement: Placement | None = None
        self._lag_task: Any = None
        self._lock = threading.Lock()
        self._announced: set[str] = set()

    # ---- the executor and its placement ----------------------------------------

    def placement(self, vllm_config: Any) -> Placement:
        """The placement, its executor built and started at the first call."""
        with self._lock:
            if self._placement is None or self._placement.executor.closed:
                executor = self._build(vllm_config)
                self._start(executor, vllm_config)
                self._placement = self._placement_class(
                    executor,
                    batch_across_requests=self.settings.batch_across_requests,
                    inline_cost=self.settings.inline_cost,
                )
            placement = self._placement
        self._sample_loop_lag()
        return placement

    def current_executor(self) -> offload.Executor | None:
        """The executor built so far (admission's), or `None`."""
        placement = self._placement
        return None if placement is None else placement.executor

    def _build(self, vllm_config: Any) -> offload.Executor:
        settings = self.settings
        row = settings.row
        shared = host_share(row, vllm_config)
        workers = settings.workers if settings.workers is not None else shared
        if not row.kind.shares_one_renderer(workers) and config_seam.shared_multimodal_cache(vllm_config):
            raise OffloadVLLMConfigError(
                f"strategy {self.strategy!r} renders in several workers, but this multimodal "
                "model keeps vLLM's multimodal processor cache, which workers cannot share; "
                "serve with --mm-processor-cache-gb 0, or OFFLOAD_VLLM_WORKERS=1 with thread, "
                "or use inline or async-renderer"
            )
        policy = config_seam.scheduling_policy(vllm_config)
        if settings.engine_priority and policy != config_seam.PRIORITY_POLICY:
            raise OffloadVLLMConfigError(
                f"{ENGINE_PRIORITY_ENV} (--offload-engine-priority) sets each request's engine "
                f"priority, which vLLM reads only with --scheduling-policy "
                f"{config_seam.PRIORITY_POLICY}; this server's policy is {policy!r}: serve with "
                f"--scheduling-policy {config_seam.PRIORITY_POLICY}, or unset it"
            )
        options: dict[str, Any] = {}
        if workers is not None:
            options["max_workers"] = workers
        if row.kind.queue:
            index, count = config_seam.api_server_of(vllm_config)
            options.update(
                max_queue=server_share(settings.max_queue, index, count),
                max_queued_cost=server_share(settings.max_queued_cost, index, count),
                lanes=settings.lane_weights(),
                scheduling=settings.scheduling,
            )
        for setting, option in row.own_options.items():
            value = getattr(settings, setting)
            if value is not None:
                options[option] = value
        if row.kind.batches:
            options["max_wait"] = settings.batch_window
            if self._in_flight is not None:
                options["in_flight"] = self._in_flight
        options.update(
            self._placement_class.executor_options(vllm_config, row, prefix_tokenize=settings.prefix_tokenize)
        )
        return offload.get_executor(self.strategy, **options)

    def _start(self, executor: offload.Executor, vllm_config: Any) -> None:
        """Start every worker now: this runs while vLLM builds its pooling
        entrypoints, before the port opens, so no worker (a process importing
        vLLM and loading the tokenizer, a Ray actor) is spawned under load. A
        worker that cannot start stops the server here, with its error.

        Then the start-up summary, once per API server process (only they
        build pooling entrypoints): what was started, and the settings."""
        began = time.perf_counter()
        if executor.capacity is not None:  # inline has no workers
            try:
                executor.start()
            except BaseException:
                # The server will not come up: leave no worker behind.
                executor.shutdown(wait=False, cancel_futures=True)
                raise
        logger.info("offload-vllm: %s", self._summary(executor, time.perf_counter() - began, vllm_config))

    def _summary(self, executor: offload.Executor, seconds: float, vllm_config: Any) -> str:
        """`thread started 6 workers in 0.31s, and the express worker; strategy=thread
        workers=6(default) express_cost=2000 inline_cost=200 ... (from ...)`, with
        `; API server 1 of 2` when there are several."""
        settings = self.settings
        shown: dict[str, str] = {}
        if executor.capacity is None:
            started = "no workers"
        else:
            workers = getattr(executor.strategy, "max_workers", None)
            started = "its worker" if workers is None else f"{workers} worker{'' if workers == 1 else 's'}"
            if workers is not None and settings.row.kind.pool:
                shown["workers"] = f"{workers}{'' if settings.workers is not None else _default_workers(vllm_config)}"
        express = ", and the express worker" if float(getattr(executor.strategy, "express_cost", 0.0)) > 0 else ""
        if "express_cost" in settings.row.own_options:
            shown["express_cost"] = f"{settings.express_cost:g}"
        if settings.row.kind.pool:
            shown["inline_cost"] = f"{settings.inline_cost:g}"
        index, count = config_seam.api_server_of(vllm_config)
        for name, value in (("max_queue", settings.max_queue), ("max_queued_cost", settings.max_queued_cost)):
            if count > 1 and value is not None and settings.row.kind.queue:
                shown[name] = f"{server_share(value, index, count):g}(server: {value:g} / {count} API servers)"
        which = f"; API server {index + 1} of {count}" if count > 1 else ""
        return (
            f"{self.strategy} started {started} in {seconds:.2f}s{express}; "
            f"{settings.summary(shown)} (from {settings.strategy_source}){which}"
        )

    def _sample_loop_lag(self) -> None:
        """Feed `offload_loop_lag_seconds{loop="vllm-api-server"}` from the API
        server's event loop, for as long as the server runs. vLLM builds its
        pooling entrypoints inside that loop; offline use has none."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._lag_task is None or self._lag_task.done():
            self._lag_task = loop.create_task(
                offload.sample_loop_lag(LAG_LOOP_LABEL), name="offload-vllm-loop-lag"
            )

    def _announce(self, what: str) -> None:
        if what not in self._announced:
            self._announced.add(what)
            logger.info("offload-vllm: %s runs under strategy %r", what, self.strategy)

    # ---- what the seams ask for -------------------------------------------------

    def render(self, io_processor: Any, vllm_config: Any) -> tuple[RenderAsync, RenderAll]:
        """A new IO processor's `render_async` and `render_all` (`_seams/io_processor.py`)."""
        placement = self.placement(vllm_config)
        self._announce(f"{type(io_processor).__name__}.render_async")
        return placement.render_async(io_processor), placement.render_all(io_processor)

    def render_generate(self, renderer: Any) -> RenderGenerate:
        """A new `OnlineRenderer`'s text render for the generate routes (`_seams/generate.py`)."""
        placement = self.placement(renderer.config)
        self._announce("generate routes' render (render_chat, render_cmpl)")
        return placement.render_generate(renderer)

    def process_multimodal(self, renderer: Any) -> ProcessMultimodal | None:
        """A new renderer's `_process_multimodal_async` (`_seams/multimodal.py`), or `None`: vLLM's own."""
        made = self.placement(renderer.config).process_multimodal_async(renderer)
        if made is not None:
            self._announce("multimodal processing (BaseRenderer._process_multimodal_async)")
        return made

    def postprocess(self, serving: Any) -> PostprocessAsync:
        """A new serving object's `_postprocessing_async` (`_seams/serving.py`)."""
        placement = self.placement(serving.vllm_config)
        self._announce(f"{type(serving).__name__}._postprocessing_async")
        return timing_response(placement.postprocess_async(serving))

    def offline_executor(self, vllm_config: Any) -> concurrent.futures.Executor:
        """An offline `LLM`'s render executor (`_seams/offline.py`)."""
        placement = self.placement(vllm_config)
        self._announce("LLM offline render map")
        return OfflineRenderExecutor(placement)


_Bound = TypeVar("_Bound", int, float)


def server_share(bound: _Bound | None, index: int, count: int) -> _Bound | None:
    """API server `index`'s share of a bound set for the whole server of
    `count` API server processes (`None`: unbounded): a cost, 1/count of it;
    a number of places or requests, split as evenly as whole numbers go (the
    first `bound % count` processes one more), so that the shares add up to
    the bound exactly. Each process admits within its share alone (no
    counts cross processes); vLLM hands each new connection to the API
    server with the fewest open ones, which keeps the shares evenly used
    (docs/decisions/0032-server-bounds-split-between-api-servers.md)."""
    if bound is None or count <= 1:
        return bound
    if isinstance(bound, int):
        return bound // count + (1 if index < bound % count else 0)
    return bound / count


def host_share(row: StrategyRow, vllm_config: Any) -> int | None:
    """The default size of this API server process's pool when the server
    runs N > 1 of them (`--api-server-count`): the host's usable cores over
    N, at least 1, so that the N pools together fit the machine (each
    process would otherwise size its own for the whole host). `None` with one
    API server, for a strategy without a pool, or one whose workers are not
    on this host (Ray's)."""
    cores, count = _cores_and_api_servers(vllm_config)
    if count <= 1 or not row.kind.pool or not row.workers_on_host:
        return None
    return max(1, cores // count)


def _default_workers(vllm_config: Any) -> str:
    """How a default worker count is shown: `(default)`, or with several API
    servers `(default: 8 cores / 2 API servers)`, the split `host_share` made."""
    cores, count = _cores_and_api_servers(vllm_config)
    return "(default)" if count <= 1 else f"(default: {cores} cores / {count} API servers)"


def _cores_and_api_servers(vllm_config: Any) -> tuple[int, int]:
    return offload.strategy.usable_cpu_count(), config_seam.api_server_of(vllm_config)[1]
