"""Seam: `OpenAIServingModels.__init__` (`vllm/entrypoints/openai/models/serving.py`),
the first object vLLM's `init_app_state` builds with the engine client, for
every model (pooling and generate alike), inside the API server's event loop:
where the adapter first holds the engine client (its health check, its
`--max-num-queued-reqs`, which of several API server processes this is)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from vllm.entrypoints.openai.models.serving import OpenAIServingModels

_ORIGINAL_INIT = OpenAIServingModels.__init__


def install(on_engine_client: Callable[[Any], None]) -> None:
    """`on_engine_client(engine_client)` as each `OpenAIServingModels` is built
    (once per API server process, where vLLM serves), after vLLM's `__init__`.
    Once: a second call changes nothing."""
    if getattr(OpenAIServingModels.__init__, "__offload_vllm__", False):
        return

    @functools.wraps(_ORIGINAL_INIT)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _ORIGINAL_INIT(self, *args, **kwargs)
        on_engine_client(self.engine_client)

    __init__.__offload_vllm__ = True  # type: ignore[attr-defined]
    OpenAIServingModels.__init__ = __init__  # type: ignore[method-assign]
