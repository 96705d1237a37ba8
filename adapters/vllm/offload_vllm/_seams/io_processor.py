"""Seam: `vllm/entrypoints/pooling/base/io_processor.py`, `PoolingIOProcessor.__init__`.

vLLM sets `self.render_async = make_async(self.render, executor=renderer._executor)`
there; pre-processing of every online pooling request goes through it
(`PoolingBaseServing._preprocessing`). We let vLLM build the processor, then
replace `render_async` with the strategy's, and give the processor a
`render_all`, which renders all of one request's prompts in pieces (see
`serving.install_preprocessing`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine
from typing import Any

from vllm.entrypoints.pooling.base.io_processor import (
    PoolingIOProcessor,
)

RenderAsync = Callable[[Any], Coroutine[Any, Any, Any]]
RenderAll = Callable[[list[Any]], Coroutine[Any, Any, list[Any]]]

# What this seam keeps on each processor it patched; read through the functions below.
_RENDER_ALL = "_offload_vllm_render_all"
_CHAT_TEMPLATE_CONFIG = "_offload_vllm_chat_template_config"

_ORIGINAL_INIT: Callable[..., None] = PoolingIOProcessor.__init__
_SIGNATURE = inspect.signature(_ORIGINAL_INIT)


def construction_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(vllm_config, renderer, chat_template_config) from a call of `PoolingIOProcessor(...)`."""
    bound = _SIGNATURE.bind(None, *args, **kwargs)
    return bound.arguments["vllm_config"], bound.arguments["renderer"], bound.arguments[
        "chat_template_config"
    ]


def install(make_render: Callable[[Any, Any], tuple[RenderAsync, RenderAll] | None]) -> None:
    """`make_render(io_processor, vllm_config)` gives a new processor its
    `render_async` and its `render_all` (`None`: vLLM's own)."""
    if getattr(PoolingIOProcessor.__init__, "__offload_vllm__", False):
        return

    @functools.wraps(_ORIGINAL_INIT)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _ORIGINAL_INIT(self, *args, **kwargs)
        vllm_config, _, chat_template_config = construction_args(args, kwargs)
        # Kept for rebuilding this processor in a worker process.
        setattr(self, _CHAT_TEMPLATE_CONFIG, chat_template_config)
        made = make_render(self, vllm_config)
        if made is not None:
            self.render_async, render_all = made
            setattr(self, _RENDER_ALL, render_all)

    __init__.__offload_vllm__ = True  # type: ignore[attr-defined]
    PoolingIOProcessor.__init__ = __init__  # type: ignore[method-assign]


def render_all(io_processor: Any) -> RenderAll | None:
    """What renders all of one request's prompts for `io_processor`, or `None`
    where the adapter did not build it (vLLM renders them one call each)."""
    found: RenderAll | None = getattr(io_processor, _RENDER_ALL, None)
    return found


def chat_template_config(io_processor: Any) -> Any:
    """The chat-template config `io_processor` was built with (`None` if it was
    built before the adapter was installed)."""
    return getattr(io_processor, _CHAT_TEMPLATE_CONFIG, None)


def is_io_processor(obj: object) -> bool:
    return isinstance(obj, PoolingIOProcessor)


def has_own_render(io_processor: Any) -> bool:
    """Whether `io_processor`'s class overrides `PoolingIOProcessor.render` (scoring
    processors; from vLLM 0.33.0 `TokenEmbedIOProcessor`, which prepares late
    chunking there), so that only its own `render` renders its requests right."""
    return type(io_processor).render is not PoolingIOProcessor.render
