"""The strategy applied to vLLM: one executor per server process, built when vLLM
builds its first pooling entrypoint (still at start-up, before the port opens)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import offload

from . import _workers
from ._config import SPEC_STRATEGIES, OffloadVLLMConfigError, Settings
from ._seams import renderer as renderer_seam
from ._seams import serving as serving_seam

logger = logging.getLogger("vllm.offload_vllm")

#: The `loop` label of the API server's loop-lag histogram.
LAG_LOOP_LABEL = "vllm-api-server"


def _announce(seen: set[str], what: str, strategy: str) -> None:
    if what not in seen:
        seen.add(what)
        logger.info("offload-vllm: %s runs under strategy %r", what, strategy)


class Runtime:
    def __init__(self, settings: Settings) -> None:
        if settings.strategy is None:
            raise ValueError("Runtime needs a strategy")
        self.strategy: str = settings.strategy
        self.workers = settings.workers
        self.max_queue = settings.max_queue
        self.ray_address = settings.ray_address
        self._lag_task: Any = None
        self._executor: offload.Executor | None = None
        self._lock = threading.Lock()
        self._announced: set[str] = set()

    # ---- the executor ------------------------------------------------------

    def executor(self, vllm_config: Any) -> offload.Executor:
        with self._lock:
            if self._executor is None or self._executor.closed:
                executor = self._build(vllm_config)
                self._start(executor)
                self._executor = executor
        self._sample_loop_lag()
        return self._executor

    def _start(self, executor: offload.Executor) -> None:
        """Start every worker now: this runs while vLLM builds its pooling
        entrypoints, before the port opens, so no worker (a process importing
        vLLM and loading the tokenizer, a Ray actor) is spawned under load. A
        worker that cannot start stops the server here, with its error."""
        if executor.capacity is None:
            return  # inline: no workers
        began = time.perf_counter()
        try:
            executor.start()
        except BaseException:
            # The server will not come up: leave no worker behind.
            executor.shutdown(wait=False, cancel_futures=True)
            raise
        workers = getattr(executor.strategy, "max_workers", None)
        logger.info(
            "offload-vllm: %s started %s in %.2fs",
            self.strategy,
            "its worker" if workers is None else f"{workers} workers",
            time.perf_counter() - began,
        )

    def current_executor(self, serving: Any = None) -> offload.Executor | None:
        """The executor built so far (the admission check's), or `None`."""
        return self._executor

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

    def _build(self, vllm_config: Any) -> offload.Executor:
        several = self.strategy in SPEC_STRATEGIES or (self.strategy == "thread" and self.workers != 1)
        if several and renderer_seam.shared_multimodal_cache(vllm_config):
            raise OffloadVLLMConfigError(
                f"strategy {self.strategy!r} renders in several workers, but this multimodal "
                "model keeps vLLM's multimodal processor cache, which workers cannot share; "
                "serve with --mm-processor-cache-gb 0, or OFFLOAD_VLLM_WORKERS=1 with thread, "
                "or use inline or async-renderer"
            )
        options: dict[str, Any] = {}
        if self.workers is not None:
            options["max_workers"] = self.workers
        if self.max_queue is not None:
            options["max_queue"] = self.max_queue
        if self.strategy == "thread":
            options.update(initializer=_workers.init_thread_worker, thread_name_prefix="offload-vllm")
        elif self.strategy == "process":
            options.update(initializer=_workers.init_process_worker, initargs=(vllm_config,))
        elif self.strategy == "ray":
            options.update(initializer=_workers.init_ray_worker, initargs=(vllm_config,))
            if self.ray_address is not None:
                options["address"] = self.ray_address
        return offload.get_executor(self.strategy, **options)

    # ---- pre-processing: PoolingIOProcessor.render_async ----------------------

    def render_call(
        self, io_processor: Any, chat_template_config: Any
    ) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        """The function (and leading arguments) that renders one request's parameters."""
        if self.strategy == "thread":
            return _workers.render_in_thread, (io_processor,)
        if self.strategy in SPEC_STRATEGIES:
            spec = _workers.IOProcessorSpec(type(io_processor), chat_template_config)
            return _workers.render_in_process, (spec,)
        return io_processor.render, ()

    def make_render_async(
        self, io_processor: Any, vllm_config: Any, chat_template_config: Any
    ) -> Callable[[Any], Coroutine[Any, Any, Any]] | None:
        if _workers.IN_WORKER_PROCESS:
            return None
        executor = self.executor(vllm_config)
        fn, lead = self.render_call(io_processor, chat_template_config)
        _announce(self._announced, f"{type(io_processor).__name__}.render_async", self.strategy)

        if self.strategy == "async-renderer":
            self._batch_tokenization(io_processor.renderer, executor)

            async def render_async(render_params: Any) -> Any:
                result = await renderer_seam.render_with_async_renderer(io_processor, render_params)
                if result is None:
                    result = await executor.run(fn, *lead, render_params)
                return result

            return render_async

        async def render_async_offloaded(render_params: Any) -> Any:
            return await executor.run(fn, *lead, render_params)

        return render_async_offloaded

    def make_render_all(
        self, io_processor: Any, vllm_config: Any, chat_template_config: Any
    ) -> Callable[[list[Any]], Coroutine[Any, Any, list[Any]]] | None:
        """Render a request's prompts in as few calls as the pool has workers
        (thread, process, ray): one hand-off for several prompts, while a large
        request still spreads over every worker. Inline has no hand-off, and
        async-renderer batches the tokenization of every prompt already."""
        if _workers.IN_WORKER_PROCESS or self.strategy not in ("thread", *SPEC_STRATEGIES):
            return None
        executor = self.executor(vllm_config)
        if self.strategy == "thread":
            fn: Callable[..., list[Any]] = _workers.render_all_in_thread
            lead: tuple[Any, ...] = (io_processor,)
        else:
            fn = _workers.render_all_in_process
            lead = (_workers.IOProcessorSpec(type(io_processor), chat_template_config),)
        workers = executor.capacity or 1

        async def render_all(render_params: list[Any]) -> list[Any]:
            chunks = split_evenly(render_params, workers)
            if len(chunks) == 1:
                return await executor.run(fn, *lead, chunks[0])
            # Every chunk ends before the first error (in prompt order, as
            # vLLM's single renderer thread reports it) is raised.
            outcomes = await asyncio.gather(
                *(executor.run(fn, *lead, chunk) for chunk in chunks), return_exceptions=True
            )
            rendered: list[Any] = []
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
                rendered.extend(outcome)
            return rendered

        return render_all

    def _batch_tokenization(self, renderer: Any, executor: offload.Executor) -> None:
        def tokenize(prompt: Any, /, *, params: Any) -> Any:
            return renderer_seam.tokenize_one(renderer, prompt, params)

        def tokenize_batch(prompts: list[Any], *, params: Any) -> list[Any]:
            return renderer_seam.tokenize_many(renderer, prompts, params)

        batched = offload.make_async(tokenize, executor=executor, batch=tokenize_batch)

        async def tokenize_async(prompt: Any, params: Any) -> Any:
            return await batched(prompt, params=params)

        renderer_seam.install_batched_tokenizer(renderer, tokenize_async)

    # ---- post-processing: PoolingBaseServing._postprocessing_async -------------

    def make_postprocess_async(
        self, serving: Any
    ) -> Callable[[Any, Any], Coroutine[Any, Any, Any]] | None:
        if _workers.IN_WORKER_PROCESS:
            return None
        executor = self.executor(serving.vllm_config)
        _announce(self._announced, f"{type(serving).__name__}._postprocessing_async", self.strategy)
        if self.strategy in SPEC_STRATEGIES:
            chat_config = serving.chat_template_config
            # Taken at the first request, not here: subclasses (ServingEmbedding) set
            # attributes after the base __init__ this is called from.
            specs: list[_workers.ServingSpec] = []

            async def postprocess_in_worker(io_processor: Any, ctx: Any) -> Any:
                if not specs:
                    specs.append(_workers.serving_spec(serving))
                io_spec = _workers.IOProcessorSpec(type(io_processor), chat_config)
                return await executor.run(
                    _workers.postprocess_in_process, specs[0], io_spec, serving_seam.strip_context(ctx)
                )

            return postprocess_in_worker

        async def postprocess(io_processor: Any, ctx: Any) -> Any:
            return await executor.run(serving_seam.postprocess, serving, io_processor, ctx)

        return postprocess

    # ---- offline: LLM.embed()/score() map render over this -----------------

    def make_offline_executor(self, vllm_config: Any) -> concurrent.futures.Executor | None:
        if _workers.IN_WORKER_PROCESS:
            return None
        _announce(self._announced, "LLM offline render map", self.strategy)
        return _OfflineRenderExecutor(self, self.executor(vllm_config))


def split_evenly(items: list[Any], parts: int) -> list[list[Any]]:
    """`items` in at most `parts` contiguous chunks whose sizes differ by one at most."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    chunks, start = [], 0
    for i in range(parts):
        end = start + size + (i < extra)
        chunks.append(items[start:end])
        start = end
    return chunks


class _OfflineRenderExecutor(concurrent.futures.Executor):
    """What `PoolingOfflineMixin._executor` becomes: `map(io_processor.render, ...)` is
    routed to the strategy's per-worker render; anything else runs as submitted."""

    def __init__(self, runtime: Runtime, executor: offload.Executor) -> None:
        self._runtime = runtime
        self._executor = executor

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        owner = getattr(fn, "__self__", None)
        if getattr(fn, "__name__", None) == "render" and _is_io_processor(owner):
            chat_config = _chat_template_config_of(owner)
            target, lead = self._runtime.render_call(owner, chat_config)
            return self._executor.submit(target, *lead, *args, **kwargs)
        return self._executor.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._executor.shutdown(wait=wait, cancel_futures=cancel_futures)


def _is_io_processor(obj: object) -> bool:
    from ._seams.io_processor import is_io_processor

    return is_io_processor(obj)


def _chat_template_config_of(io_processor: Any) -> Any:
    return getattr(io_processor, "__offload_vllm_chat_template_config__", None)
