"""Batched (`async-renderer`): vLLM's async renderer on the loop, tokenization micro-batched."""

from __future__ import annotations

import asyncio
from typing import Any

from .._kinds import BATCHED
from .._seams import generate as generate_seam
from .._seams import renderer as renderer_seam
from .._seams import requests as requests_seam
from .._seams.generate import RenderGenerate
from .._seams.io_processor import RenderAll, RenderAsync
from .._seams.multimodal import ProcessMultimodal
from .base import Call, Placement


class Batched(Placement):
    """Completion- and chat-style inputs go through vLLM's async renderer
    methods (`render_cmpl_async`, `render_chat_async`) on the loop; their
    tokenization step is replaced by a call on the executor that the strategy
    runs in micro-batches (one tokenizer call per batch of prompts with the
    same parameters, by value: concurrent requests share a batch, unless
    `OFFLOAD_VLLM_BATCH_ACROSS_REQUESTS=0`). What has no async path in vLLM (scoring pairs, a
    processor that overrides `render`) runs `render` on the executor, as does
    the offline path."""

    kind = BATCHED

    def render_call(self, io_processor: Any) -> Call:
        return io_processor.render, ()

    def render_async(self, io_processor: Any) -> RenderAsync:
        self._batch_tokenization(io_processor.renderer)
        by_render = super().render_async(io_processor)

        async def render_async(render_params: Any) -> Any:
            result = await renderer_seam.render_with_async_renderer(io_processor, render_params)
            if result is None:
                result = await by_render(render_params)
            return result

        return render_async

    def render_all(self, io_processor: Any) -> RenderAll:
        """One `render_async` per prompt, gathered (as vLLM does): each prompt's
        tokenization is already a call the strategy batches with others."""
        render_async = self.render_async(io_processor)

        async def render_all(render_params: list[Any]) -> list[Any]:
            return list(await asyncio.gather(*(render_async(params) for params in render_params)))

        return render_all

    def render_generate(self, renderer: Any) -> RenderGenerate:
        """vLLM's own async render on the loop, its tokenization micro-batched (as `render_async`)."""
        self._batch_tokenization(renderer)

        async def render_generate(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return await generate_seam.render_async(renderer, method, args, kwargs)

        return render_generate

    def process_multimodal_async(self, renderer: Any) -> ProcessMultimodal | None:
        """vLLM's own: its one-thread multimodal executor (no batch form to join)."""
        return None

    def _batch_tokenization(self, renderer: Any) -> None:
        def tokenize(prompt: Any, /, *, params: Any, group: int | None) -> Any:
            return renderer_seam.tokenize_one(renderer, prompt, params)

        def tokenize_batch(prompts: list[Any], *, params: Any, group: int | None) -> list[Any]:
            return renderer_seam.tokenize_many(renderer, prompts, params)

        batched = self.executor.strategy.batch_form(tokenize, tokenize_batch)

        across = self.batch_across_requests

        async def tokenize_async(prompt: Any, params: Any) -> Any:
            # Its characters alone: a micro-batch shares the per-prompt work.
            # Calls batch when their keyword arguments are equal by value (vLLM's
            # TokenizeParams, new per request, by its fields): across requests.
            # Off, `group` is the parameters' identity: one request's prompts
            # (which share the object) batch only with each other.
            group = None if across else id(params)
            return await self.executor.options(cost=requests_seam.prompt_cost(prompt, params)).run(
                batched, prompt, params=params, group=group
            )

        renderer_seam.install_batched_tokenizer(renderer, tokenize_async)
