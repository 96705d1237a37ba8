"""Seam: `vllm/renderers/base.py`, `BaseRenderer` (and `vllm/renderers/registry.py`).

- Per-worker renderers: `thread` gives each worker thread a shallow copy of the
  served renderer with its own deep-copied tokenizer (Hugging Face fast tokenizers
  are not thread-safe: "Already borrowed"); `process` builds one per worker process
  from the served model's `VllmConfig` with `renderer_from_config`.
- `async-renderer`: the pooling `render` done with vLLM's own async renderer
  methods (`render_cmpl_async`, `render_chat_async`), whose tokenization step
  (`BaseRenderer._tokenize_prompt_async`, an instance attribute set in `__init__`)
  we replace with a micro-batched one.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Coroutine
from typing import Any

from .io_processor import has_own_render


def renderer_from_config(vllm_config: Any) -> Any:
    from vllm.renderers.registry import renderer_from_config as build

    return build(vllm_config)


def with_own_tokenizer(renderer: Any) -> Any:
    """A copy of `renderer` that shares everything but the tokenizer."""
    clone = copy.copy(renderer)
    clone.tokenizer = copy.deepcopy(renderer.tokenizer)
    return clone


def rebind_io_processor(io_processor: Any, renderer: Any) -> Any:
    """A shallow copy of a pooling IO processor that renders with `renderer`."""
    clone = copy.copy(io_processor)
    old_tokenizer = getattr(io_processor.renderer, "tokenizer", None)
    clone.renderer = renderer
    # Scoring processors keep their own reference to the tokenizer.
    if old_tokenizer is not None and getattr(io_processor, "tokenizer", None) is old_tokenizer:
        clone.tokenizer = renderer.tokenizer
    return clone


# ---- async-renderer --------------------------------------------------------

TokenizeOne = Callable[..., Coroutine[Any, Any, Any]]


def tokenize_one(renderer: Any, prompt: Any, params: Any) -> Any:
    return renderer._tokenize_prompt(prompt, params)


def tokenize_many(renderer: Any, prompts: list[Any], params: Any) -> list[Any]:
    """One tokenizer call for many prompts with the same parameters (fast tokenizers
    encode a list in parallel in Rust). Falls back per prompt where vLLM wants
    character offsets, which `_tokenize_prompt` handles itself."""
    if any(renderer._wants_offsets(p, params) for p in prompts):
        return [renderer._tokenize_prompt(p, params) for p in prompts]
    encoding = renderer.get_tokenizer()([p["prompt"] for p in prompts], **params.get_encode_kwargs())
    return [
        renderer._build_tokens_prompt(ids, prompt, offset_mapping=None)
        for ids, prompt in zip(encoding["input_ids"], prompts, strict=True)
    ]


# Set on a renderer whose tokenization this seam replaced; read by `install_batched_tokenizer` only.
_BATCHED = "_offload_vllm_batched"


def install_batched_tokenizer(renderer: Any, tokenize_async: TokenizeOne) -> None:
    """Make `renderer`'s async tokenization step await `tokenize_async(prompt, params)`;
    a renderer already made so keeps its first one (IO processors share the served renderer)."""
    if getattr(renderer, _BATCHED, False):
        return
    renderer._tokenize_prompt_async = tokenize_async
    setattr(renderer, _BATCHED, True)


async def render_with_async_renderer(io_processor: Any, render_params: Any) -> Any | None:
    """`PoolingIOProcessor.render` through the renderer's async methods, or `None`
    where that would not be what the processor's `render` does: run those with
    `render`. That is parameters with no async path in vLLM (scoring pairs), and
    any processor whose class overrides `render` (this mirrors only the base one)."""
    if has_own_render(io_processor):
        return None
    renderer = io_processor.renderer
    if "conversations" in render_params:
        (_,), engine_input = await renderer.render_chat_async(
            [render_params["conversations"]],
            render_params["chat_params"],
            render_params["tok_params"],
            prompt_extras=render_params["prompt_extras"],
            skip_mm_cache=render_params["skip_mm_cache"],
        )
    elif "prompts" in render_params:
        engine_input = await renderer.render_cmpl_async(
            [render_params["prompts"]],
            render_params["tok_params"],
            prompt_extras=render_params["prompt_extras"],
            skip_mm_cache=render_params["skip_mm_cache"],
        )
    else:
        return None
    # PoolingEngineInput is a TypedDict: a dict with these keys.
    return {
        "prompts": engine_input[0],
        "params": render_params["params"],
        "lora_requests": render_params["lora_requests"],
        "priorities": render_params["priorities"],
    }
