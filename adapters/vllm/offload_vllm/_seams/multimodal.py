"""Seam: `vllm/renderers/base.py`, `BaseRenderer.__init__` and its `_process_multimodal_async`.

A chat or completion request with images reaches the engine through
`BaseRenderer._process_tokens_async`, which awaits
`self._process_multimodal_async(...)`: vLLM's `_process_multimodal` (the
model's multimodal processor, the Hugging Face processor inside it) on the
renderer's one-thread `_mm_executor`. We let vLLM build the renderer, then
replace that instance attribute with the strategy's run of the same
`_process_multimodal` (`_placements`, `process_multimodal_async`): on the
loop (`inline`), on a worker thread's copy of the renderer with a processor
of its own (`thread`; where they share the served renderer's processor
cache, one at a time), on the worker process's renderer (`process`: the
decoded images go there, the processed inputs with their tensors come back).
`async-renderer` keeps vLLM's own executor. Loading the images (decoding a
data URL, fetching a URL) happens before, in vLLM's chat parsing, on vLLM's
media thread pool, and is not changed.

The processor cache (`--mm-processor-cache-gb`) pairs the renderer's sender
cache with one receiver in the engine: the start-up check that refuses it
with several renderers is `config.shared_multimodal_cache` (decision 0030).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import os
import threading
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from vllm.renderers.base import BaseRenderer

from .._cost import IMAGE_COST, PIXEL_COST, URL_IMAGE_COST

#: `process(args, kwargs)`: the strategy's run of `renderer._process_multimodal(*args, **kwargs)`.
ProcessMultimodal = Callable[[tuple[Any, ...], dict[str, Any]], Coroutine[Any, Any, Any]]

_ORIGINAL_INIT: Callable[..., None] = BaseRenderer.__init__


def process(renderer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """vLLM's own synchronous multimodal processing, `renderer._process_multimodal`."""
    return renderer._process_multimodal(*args, **kwargs)


#: Set on a served renderer: held by a worker thread while it processes with
#: that renderer's processor cache (`process_in_thread`).
_CACHE_LOCK = "_offload_vllm_mm_cache_lock"


def process_in_thread(served: Any, own: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`process` with a worker thread's copy `own` of `served`. Where the two
    share a processor cache (on: the strategy has one regular worker, and the
    express worker beside it), one thread at a time uses it, as in vLLM's one
    thread: the cache is not thread-safe."""
    if served.mm_processor_cache is None:
        return process(own, args, kwargs)
    with getattr(served, _CACHE_LOCK):
        return process(own, args, kwargs)


def with_own_processor(renderer: Any) -> Any:
    """A copy of `renderer` with a tokenizer and a multimodal processor of its
    own (the processor holds a tokenizer, and its Hugging Face processor is not
    known to be thread-safe); the processor cache, the request counter (thread-safe)
    and the rest are shared."""
    from vllm.multimodal import MULTIMODAL_REGISTRY

    clone = copy.copy(renderer)
    clone.tokenizer = copy.deepcopy(renderer.tokenizer)
    clone.mm_processor = MULTIMODAL_REGISTRY.create_processor(renderer.model_config, tokenizer=clone.tokenizer)
    return clone


class _ProcessCounter:
    """`AtomicCounter`'s `inc`, counting on from a start no other worker process shares."""

    def __init__(self, start: int) -> None:
        self._value = start
        self._lock = threading.Lock()

    def inc(self, num: int = 1) -> int:
        with self._lock:
            self._value += num
            return self._value


def count_requests_apart(renderer: Any) -> None:
    """Give a worker process's `renderer` multimodal request ids no other
    renderer of the server makes. vLLM names a request's images by
    `renderer{rank}-mm-{n}` when the processor cache and prefix caching are off,
    and the engine keys its encoder cache by those names: two worker processes
    counting from 1 would name different images alike. The pid, shifted past
    any count one renderer reaches, keeps them apart."""
    if getattr(renderer, "_mm_req_counter", None) is not None:
        renderer._mm_req_counter = _ProcessCounter(os.getpid() << 40)


def multimodal_cost(mm_data: Mapping[str, Any]) -> float:
    """The price of processing `mm_data` (`_cost.py`): each image `IMAGE_COST`
    and its pixels; anything else (a video, audio, embeddings) as a 512 x 512 image."""
    cost = 0.0
    for items in mm_data.values():
        for item in items if isinstance(items, list) else [items]:
            size = getattr(item, "size", None)
            if isinstance(size, tuple) and len(size) == 2:
                cost += IMAGE_COST + PIXEL_COST * size[0] * size[1]
            else:
                cost += URL_IMAGE_COST
    return cost


def install(make_process: Callable[[Any], ProcessMultimodal | None]) -> None:
    """`make_process(renderer)` gives a new renderer with a multimodal processor,
    built while an event loop runs (the API server's engine client), its
    `_process_multimodal_async` (`None`: vLLM's own). Idempotent."""
    if getattr(BaseRenderer.__init__, "__offload_vllm__", False):
        return

    @functools.wraps(_ORIGINAL_INIT)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _ORIGINAL_INIT(self, *args, **kwargs)
        if self.mm_processor is None:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # offline `LLM`: its render is synchronous
            return
        setattr(self, _CACHE_LOCK, threading.Lock())
        made = make_process(self)
        if made is not None:
            self._process_multimodal_async = made

    __init__.__offload_vllm__ = True  # type: ignore[attr-defined]
    BaseRenderer.__init__ = __init__  # type: ignore[method-assign]
