"""Remote (`process`, `ray`): workers in other processes, which rebuild what they need from specs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import _workers
from .._kinds import REMOTE, StrategyRow
from .._seams import config as config_seam
from .._seams import io_processor as io_processor_seam
from .._seams import serving as serving_seam
from .base import Call, Placement


class Remote(Placement):
    """Each worker builds its renderer from the served model's `VllmConfig`
    (the initializer's argument, sent once), and on first use each IO processor
    (`_workers.IOProcessorSpec`) and serving shell (`_workers.ServingSpec`) it
    is asked for. A call sends render parameters, or a serve context without
    its HTTP request and result stream, and gets engine inputs, or the
    response, back."""

    kind = REMOTE

    @classmethod
    def executor_options(cls, vllm_config: Any, row: StrategyRow, *, prefix_tokenize: bool = True) -> dict[str, Any]:
        return {
            "initializer": _workers.init_remote_worker,
            "initargs": (config_seam.without_live_model(vllm_config), row.titles_workers, prefix_tokenize),
        }

    def render_call(self, io_processor: Any) -> Call:
        return _workers.render_in_process, (_spec_of(io_processor),)

    def generate_call(self, renderer: Any) -> Call:
        return _workers.render_generate_in_process, ()

    def multimodal_call(self, renderer: Any) -> Call:
        return _workers.process_multimodal_in_process, ()

    def postprocess_call(self, serving: Any) -> Callable[[Any, Any], Call]:
        # Taken at the first request, not here: subclasses (ServingEmbedding) set
        # attributes after the base __init__ this is called from.
        specs: list[_workers.ServingSpec] = []

        def call(io_processor: Any, ctx: Any) -> Call:
            if not specs:
                specs.append(_workers.serving_spec(serving))
            stripped = serving_seam.strip_context(ctx)
            return _workers.postprocess_in_process, (specs[0], _spec_of(io_processor), stripped)

        return call


def _spec_of(io_processor: Any) -> _workers.IOProcessorSpec:
    return _workers.IOProcessorSpec(type(io_processor), io_processor_seam.chat_template_config(io_processor))
