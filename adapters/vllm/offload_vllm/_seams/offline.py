"""Seam: `vllm/entrypoints/pooling/offline.py`, `PoolingOfflineMixin.__init__`.

`LLM.embed()/score()/classify()/encode()` render prompts with
`self._executor.map(io_processor.render, ...)` (`_run_tiling_engine`), where
`self._executor` is the renderer's thread pool. We replace `self._executor` with a
`concurrent.futures.Executor` that runs the strategy.
"""

from __future__ import annotations

import concurrent.futures
import functools
from collections.abc import Callable
from typing import Any

from vllm.entrypoints.pooling.offline import (
    PoolingOfflineMixin,
)

_ORIGINAL_INIT: Callable[..., None] = PoolingOfflineMixin.__init__


def install(make_executor: Callable[[Any], concurrent.futures.Executor | None]) -> None:
    """`make_executor(vllm_config)` gives the executor the offline path maps `render` over."""
    if getattr(PoolingOfflineMixin.__init__, "__offload_vllm__", False):
        return

    @functools.wraps(_ORIGINAL_INIT)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _ORIGINAL_INIT(self, *args, **kwargs)
        replacement = make_executor(self.llm_engine.vllm_config)
        if replacement is not None:
            self._executor = replacement

    __init__.__offload_vllm__ = True  # type: ignore[attr-defined]
    PoolingOfflineMixin.__init__ = __init__  # type: ignore[method-assign]
