"""`Placement`: where a strategy runs a pooling request's vLLM work, and with which calls."""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable
from typing import Any, ClassVar

import offload

from .._cost import characters, split_by_cost
from .._kinds import PlacementKind, StrategyRow
from .._loop_calls import LoopCall, loop_call_counters
from .._seams import generate as generate_seam
from .._seams import multimodal as multimodal_seam
from .._seams import serving as serving_seam
from .._seams.generate import RenderGenerate
from .._seams.io_processor import RenderAll, RenderAsync
from .._seams.multimodal import ProcessMultimodal
from .._seams.requests import render_params_cost
from .._seams.serving import PostprocessAsync
from .._workers import render_each

#: A function to run on the executor and the arguments it takes before the
#: call's own: `fn(*lead, ...)`.
Call = tuple[Callable[..., Any], tuple[Any, ...]]


class Placement(abc.ABC):
    """Where one strategy runs a pooling request's vLLM work (rendering, post-processing).

    One per executor, its class chosen by the strategy's kind
    (`_kinds.STRATEGY_ROWS`, `_placements.placement_class`). Every call is made on
    `executor` with a cost (`_cost.py`), except a call priced at most
    `inline_cost`, which runs on the event loop with vLLM's own objects: a
    small request then waits neither behind pieces already running on the
    workers nor for a hand-off. A request's calls are made inside its
    admission (`_admission.py`): they form one flow of its lane, so the
    executor's queue interleaves them with other requests', and its rendering
    is cut into pieces of at most `_cost.PIECE_COST` so that a small request
    never waits for all of a large one's.

    **Required**: `render_call`. **Optional**: `executor_options`,
    `postprocess_call`, and, for a placement that does not make one call per
    piece, `render_async`, `render_all`, `postprocess_async`.
    """

    kind: ClassVar[PlacementKind]

    def __init__(
        self, executor: offload.Executor, *, batch_across_requests: bool = True, inline_cost: float = 0.0
    ) -> None:
        self.executor = executor
        #: Micro-batched tokenization may join calls of different requests
        #: (`OFFLOAD_VLLM_BATCH_ACROSS_REQUESTS`); read by placements that batch.
        self.batch_across_requests = batch_across_requests
        #: A call priced at most this runs on the event loop, with vLLM's own
        #: objects, instead of on the executor (`OFFLOAD_VLLM_INLINE_COST`).
        self.inline_cost = inline_cost
        # `offload_vllm_loop_calls_total`, where calls may run on the loop.
        self._loop_counters = loop_call_counters() if inline_cost else None

    def runs_inline(self, cost: float) -> bool:
        """Whether a call of `cost` runs on the event loop rather than on the executor."""
        return bool(self.inline_cost) and cost <= self.inline_cost

    def _count_on_loop(self, call: LoopCall) -> None:
        if self._loop_counters is not None:
            self._loop_counters[call].inc()

    @classmethod
    def executor_options(cls, vllm_config: Any, row: StrategyRow, *, prefix_tokenize: bool = True) -> dict[str, Any]:
        """Options the executor needs for this placement (an initializer, ...).
        `prefix_tokenize`: workers that build renderers of their own install
        prefix tokenization in them (`OFFLOAD_VLLM_PREFIX_TOKENIZE`)."""
        return {}

    @abc.abstractmethod
    def render_call(self, io_processor: Any) -> Call:
        """`(fn, lead)`: `fn(*lead, render_params)` renders one prompt of
        `io_processor`'s, as `io_processor.render(render_params)` does. The
        offline path maps it over a batch's prompts."""

    def generate_call(self, renderer: Any) -> Call:
        """`(fn, lead)`: `fn(*lead, method, args, kwargs)` is `renderer.<method>(*args, **kwargs)`,
        a generate route's text render (`_seams/generate.py`), with `renderer` or the worker's own."""
        return generate_seam.render, (renderer,)

    def multimodal_call(self, renderer: Any) -> Call:
        """`(fn, lead)`: `fn(*lead, args, kwargs)` is `renderer._process_multimodal(*args,
        **kwargs)` (`_seams/multimodal.py`), with `renderer` or the worker's own."""
        return multimodal_seam.process, (renderer,)

    def postprocess_call(self, serving: Any) -> Callable[[Any, Any], Call]:
        """For `serving`: `(io_processor, ctx) -> (fn, args)`, where `fn(*args)`
        builds the response, as `serving._postprocessing(io_processor, ctx)` does."""

        def call(io_processor: Any, ctx: Any) -> Call:
            return serving_seam.postprocess, (serving, io_processor, ctx)

        return call

    # ---- what the seams install ----------------------------------------------

    def render_async(self, io_processor: Any) -> RenderAsync:
        """`io_processor.render_async`: one prompt, one call."""
        fn, lead = self.render_call(io_processor)

        async def render_async(render_params: Any) -> Any:
            cost = render_params_cost(render_params)
            if self.runs_inline(cost):
                self._count_on_loop("render")
                return io_processor.render(render_params)
            return await self.executor.options(cost=cost).run(fn, *lead, render_params)

        return render_async

    def render_all(self, io_processor: Any) -> RenderAll:
        """All of one request's prompts, in pieces of bounded cost, one call each
        (`_workers.render_each`), gathered: the engine inputs in prompt order, or
        the first error in prompt order (as vLLM's one renderer thread reports
        it) once every piece has ended."""
        fn, lead = self.render_call(io_processor)

        async def render_all(render_params: list[Any]) -> list[Any]:
            costs = [render_params_cost(params) for params in render_params]
            if self.runs_inline(sum(costs)):
                self._count_on_loop("render")
                return render_each(io_processor.render, (), render_params)
            runs = [
                self.executor.options(cost=sum(costs[i] for i in piece)).run(
                    render_each, fn, lead, [render_params[i] for i in piece]
                )
                for piece in split_by_cost(costs)
            ]
            if len(runs) == 1:
                return await runs[0]
            rendered: list[Any] = []
            for outcome in await asyncio.gather(*runs, return_exceptions=True):
                if isinstance(outcome, BaseException):
                    raise outcome
                rendered.extend(outcome)
            return rendered

        return render_all

    def render_generate(self, renderer: Any) -> RenderGenerate:
        """A generate route's text render (chat template and tokenization): one
        call, priced by the characters of its messages (with its template arguments) or prompts."""
        fn, lead = self.generate_call(renderer)

        async def render_generate(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            # A chat's template arguments (tools, documents) are rendered too: priced with its messages.
            cost = characters(args[0]) + (characters(vars(args[1])) if method == "render_chat" else 0)
            if self.runs_inline(cost):
                self._count_on_loop("render")
                return generate_seam.render(renderer, method, args, kwargs)
            return await self.executor.options(cost=cost).run(fn, *lead, method, args, kwargs)

        return render_generate

    def process_multimodal_async(self, renderer: Any) -> ProcessMultimodal | None:
        """`renderer._process_multimodal_async`: one call per prompt with images,
        priced by its images (`multimodal_cost`); `None` keeps vLLM's own."""
        fn, lead = self.multimodal_call(renderer)

        async def process_multimodal_async(*args: Any, **kwargs: Any) -> Any:
            mm_data = args[1] if len(args) > 1 else kwargs["mm_data"]
            cost = multimodal_seam.multimodal_cost(mm_data)
            if self.runs_inline(cost):
                self._count_on_loop("render")
                return multimodal_seam.process(renderer, args, kwargs)
            return await self.executor.options(cost=cost).run(fn, *lead, args, kwargs)

        return process_multimodal_async

    def postprocess_async(self, serving: Any) -> PostprocessAsync:
        """`serving._postprocessing_async`: one call, whose cost is the outputs'."""
        call = self.postprocess_call(serving)

        async def postprocess_async(io_processor: Any, ctx: Any) -> Any:
            cost = serving_seam.postprocess_cost(ctx)
            if self.runs_inline(cost):
                self._count_on_loop("postprocess")
                return serving_seam.postprocess(serving, io_processor, ctx)
            fn, args = call(io_processor, ctx)
            return await self.executor.options(cost=cost).run(fn, *args)

        return postprocess_async
