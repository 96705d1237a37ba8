"""Seam: `vllm/entrypoints/pooling/base/io_processor.py`, `PoolingIOProcessor.__init__`.

vLLM sets `self.render_async = make_async(self.render, executor=renderer._executor)`
there; pre-processing of every online pooling request goes through it
(`PoolingBaseServing._preprocessing`). We let vLLM build the processor, then
replace `render_async` with the strategy's. Strategies with a pool of workers
also give the processor a `render_all` (`RENDER_ALL`), which renders several
of one request's prompts per call (see `serving.install_preprocessing`).
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

#: The attribute holding an IO processor's `render_all`, where its strategy has one.
RENDER_ALL = "__offload_vllm_render_all__"

_ORIGINAL_INIT: Callable[..., None] = PoolingIOProcessor.__init__
_SIGNATURE = inspect.signature(_ORIGINAL_INIT)


def construction_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(vllm_config, renderer, chat_template_config) from a call of `PoolingIOProcessor(...)`."""
    bound = _SIGNATURE.bind(None, *args, **kwargs)
    return bound.arguments["vllm_config"], bound.arguments["renderer"], bound.arguments[
        "chat_template_config"
    ]


def install(
    make_render_async: Callable[[Any, Any, Any], RenderAsync | None],
    make_render_all: Callable[[Any, Any, Any], RenderAll | None],
) -> None:
    """`make_render_async(io_processor, vllm_config, chat_template_config)` gives its
    `render_async`; `make_render_all(...)` its `render_all`, or `None`."""
    if getattr(PoolingIOProcessor.__init__, "__offload_vllm__", False):
        return

    @functools.wraps(_ORIGINAL_INIT)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _ORIGINAL_INIT(self, *args, **kwargs)
        vllm_config, _, chat_template_config = construction_args(args, kwargs)
        # Kept for rebuilding this processor in a worker process.
        self.__offload_vllm_chat_template_config__ = chat_template_config
        replacement = make_render_async(self, vllm_config, chat_template_config)
        if replacement is not None:
            self.render_async = replacement
        render_all = make_render_all(self, vllm_config, chat_template_config)
        if render_all is not None:
            setattr(self, RENDER_ALL, render_all)

    __init__.__offload_vllm__ = True  # type: ignore[attr-defined]
    PoolingIOProcessor.__init__ = __init__  # type: ignore[method-assign]


def is_io_processor(obj: object) -> bool:
    return isinstance(obj, PoolingIOProcessor)


def has_own_render(io_processor: Any) -> bool:
    """Whether `io_processor`'s class overrides `PoolingIOProcessor.render` (scoring
    processors; from vLLM 0.33.0 `TokenEmbedIOProcessor`, which prepares late
    chunking there), so that only its own `render` renders its requests right."""
    return type(io_processor).render is not PoolingIOProcessor.render
