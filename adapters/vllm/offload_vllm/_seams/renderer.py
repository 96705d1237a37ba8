"""Seam: `vllm/renderers/base.py`, `BaseRenderer` (and `vllm/renderers/registry.py`).

- Per-worker renderers: `thread` gives each worker thread a shallow copy of the
  served renderer with its own deep-copied tokenizer (Hugging Face fast tokenizers
  are not thread-safe: "Already borrowed"); `process` builds one per worker process
  from the served model's `VllmConfig` with `renderer_from_config`.
- `async-renderer`: the pooling `render` done with vLLM's own async renderer
  methods (`render_cmpl_async`, `render_chat_async`), whose tokenization step
  (`BaseRenderer._tokenize_prompt_async`, an instance attribute set in `__init__`)
  we replace with a micro-batched one.
- Prefix tokenization (`_prefix/`): `BaseRenderer._tokenize_prompt` replaced,
  on the class, by one that tokenizes only what vLLM's truncation keeps.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from .. import _prefix
from .io_processor import has_own_render
from .scoring import install_pair_prefix_tokenization


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
    character offsets, which `_tokenize_prompt` handles itself. With prefix
    tokenization installed, truncated prompts are tokenized by prefix, together."""
    if any(renderer._wants_offsets(p, params) for p in prompts):
        return [renderer._tokenize_prompt(p, params) for p in prompts]
    texts = [p["prompt"] for p in prompts]
    ids = _prefix_ids(renderer, texts, params) if prefix_installed() else None
    if ids is None:
        ids = renderer.get_tokenizer()(texts, **params.get_encode_kwargs())["input_ids"]
    return [
        renderer._build_tokens_prompt(one, prompt, offset_mapping=None)
        for one, prompt in zip(ids, prompts, strict=True)
    ]


# ---- prefix tokenization ---------------------------------------------------


def truncation_of(params: Any, tokenizer: Any) -> tuple[int, _prefix.Side] | None:
    """The most tokens vLLM keeps of a text tokenized with `params`, and from
    which side, or `None` where it keeps them all.

    `get_encode_kwargs` either has the tokenizer truncate (`max_length`, from the
    tokenizer's own side), which vLLM then truncates again to
    `truncate_prompt_tokens` from the same side; or, with an explicit
    `truncation_side`, has it tokenize everything and truncates to
    `truncate_prompt_tokens` from that side (`TokenizeParams._token_truncation`)."""
    kwargs = params.get_encode_kwargs()
    limit = params.truncate_prompt_tokens
    if limit is not None and limit < 0:
        limit = params.max_truncation_tokens
    if kwargs.get("truncation") and kwargs.get("max_length") is not None:
        keep = int(kwargs["max_length"]) if limit is None else min(int(kwargs["max_length"]), int(limit))
        side = tokenizer.truncation_side
    elif limit is not None:
        keep, side = int(limit), params.truncation_side or tokenizer.truncation_side
    else:
        return None
    return (keep, "left" if side == "left" else "right")


def _prefix_ids(renderer: Any, texts: list[str], params: Any) -> list[list[int]] | None:
    tokenizer = renderer.get_tokenizer()
    if _prefix.plan(tokenizer).reason is not None:
        return None
    truncation = truncation_of(params, tokenizer)
    if truncation is None:
        return None
    keep, side = truncation
    # The count the texts were priced by (`_cost.truncated_cap`): its pieces are the ones tried.
    limit = params.truncate_prompt_tokens
    priced = limit if type(limit) is int and limit > 0 else None
    return _prefix.encode_truncated(tokenizer, texts, params.get_encode_kwargs(), keep, side, priced)


_WHOLE_TEXT = "_offload_vllm_whole_text_tokenize"


#: Set once a served renderer's tokenizer is one prefix tokenization is not sound for.
_served_unsound = False
#: Set once a served renderer's tokenizer is one the pair path is not sound for (`_prefix.pair_plan`).
_served_pairs_unsound = False


def plan_served(renderer: Any) -> None:
    """Check the tokenizer of `renderer`, one the server renders with, once
    (`_prefix.plan`), before any request: where prefix tokenization is not
    sound for it, its truncated texts are tokenized whole, and priced so."""
    global _served_unsound, _served_pairs_unsound
    try:
        tokenizer = renderer.get_tokenizer()
    except Exception:  # no tokenizer (`skip_tokenizer_init`): nothing is tokenized
        return
    if tokenizer is not None and _prefix.plan(tokenizer).reason is not None:
        _served_unsound = True
    if tokenizer is not None and _prefix.pair_plan(tokenizer).reason is not None:
        _served_pairs_unsound = True


def prefix_installed() -> bool:
    """Whether this process's renderers tokenize truncated prompts by prefix
    (installed, and sound for every served tokenizer checked: `plan_served`)."""
    # Not installed before vLLM's renderers are imported: no import here (costs read it).
    base = sys.modules.get("vllm.renderers.base")
    return base is not None and hasattr(base.BaseRenderer, _WHOLE_TEXT) and not _served_unsound


def pair_prefix_installed() -> bool:
    """Whether this process's cross-encoders tokenize truncated text pairs by
    prefix (`prefix_installed`, and the pair path sound for every served tokenizer)."""
    return prefix_installed() and not _served_pairs_unsound


def install_prefix_tokenization() -> None:
    """Make every renderer in this process tokenize truncated text prompts by
    prefix (`_prefix/`): `BaseRenderer._tokenize_prompt` replaced on the class,
    so copies (thread workers' renderers) and renderers built later (remote
    workers') have it too. Idempotent. The ids are exactly vLLM's own once
    truncated; prompts that want character offsets, and tokenizers prefix
    tokenization is not sound for, are tokenized whole, by vLLM's method."""
    from vllm.renderers.base import BaseRenderer

    if hasattr(BaseRenderer, _WHOLE_TEXT):
        return
    whole = BaseRenderer._tokenize_prompt

    def _tokenize_prompt(self: Any, prompt: Any, params: Any) -> Any:
        if not self._wants_offsets(prompt, params):
            ids = _prefix_ids(self, [prompt["prompt"]], params)
            if ids is not None:
                return self._build_tokens_prompt(ids[0], prompt, offset_mapping=None)
        return whole(self, prompt, params)

    setattr(BaseRenderer, _WHOLE_TEXT, whole)
    BaseRenderer._tokenize_prompt = _tokenize_prompt  # type: ignore[method-assign]
    # A cross-encoder's text pairs (`scoring.py`).
    install_pair_prefix_tokenization()


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
