"""In-thread (`thread`): worker threads render with IO processors bound to their own tokenizer."""

from __future__ import annotations

from typing import Any

from .. import _workers
from .._kinds import IN_THREAD, StrategyRow
from .base import Call, Placement


class InThread(Placement):
    """Each worker thread renders with its own copy of each IO processor, bound to
    a renderer whose tokenizer is its own (`_workers.ThreadWorker`): a Hugging
    Face fast tokenizer is never used by two threads at once ("Already
    borrowed"), and a multimodal processor of its own for requests with images.
    Post-processing runs vLLM's own code on the served objects."""

    kind = IN_THREAD

    @classmethod
    def executor_options(cls, vllm_config: Any, row: StrategyRow, *, prefix_tokenize: bool = True) -> dict[str, Any]:
        return {"initializer": _workers.init_thread_worker, "thread_name_prefix": "offload-vllm"}

    def render_call(self, io_processor: Any) -> Call:
        return _workers.render_in_thread, (io_processor,)

    def generate_call(self, renderer: Any) -> Call:
        return _workers.render_generate_in_thread, (renderer,)

    def multimodal_call(self, renderer: Any) -> Call:
        return _workers.process_multimodal_in_thread, (renderer,)
