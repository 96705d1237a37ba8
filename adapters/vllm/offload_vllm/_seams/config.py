"""Seam: the served model's `VllmConfig` (`vllm/config/`), read once, when the executor is built."""

from __future__ import annotations

import copy
from typing import Any

#: `SchedulerConfig.policy` under which vLLM runs requests by their `priority`.
PRIORITY_POLICY = "priority"


def shared_multimodal_cache(vllm_config: Any) -> bool:
    """Whether the served model keeps vLLM's multimodal processor cache, which is not
    thread-safe and is mirrored in the engine (vLLM refuses `--renderer-num-workers > 1`
    with it for pooling models, `vllm/config/model.py`)."""
    model_config = vllm_config.model_config
    mm_config = model_config.multimodal_config
    return bool(
        model_config.supports_multimodal_inputs
        and mm_config is not None
        and mm_config.mm_processor_cache_gb > 0
    )


def scheduling_policy(vllm_config: Any) -> str:
    """The engine's scheduling policy (`--scheduling-policy`: `fcfs`, `priority`)."""
    return str(vllm_config.scheduler_config.policy)


def served_model_name(vllm_config: Any) -> str:
    """The name the model is served under (`--served-model-name`)."""
    return str(vllm_config.model_config.served_model_name)


def without_live_model(vllm_config: Any) -> Any:
    """`vllm_config` as a worker process needs it to build a renderer: without
    the model layers that an engine running in this process (`LLM(...)` with
    `VLLM_ENABLE_V1_MULTIPROCESSING=0`) registers in
    `compilation_config.static_forward_context`, whose attention classes vLLM
    makes at run time and pickle cannot send. The original is left as it is."""
    compilation = vllm_config.compilation_config
    if not compilation.static_forward_context:
        return vllm_config
    sendable = copy.copy(vllm_config)
    sendable.compilation_config = copy.copy(compilation)
    sendable.compilation_config.static_forward_context = {}
    return sendable


def api_server_of(vllm_config: Any) -> tuple[int, int]:
    """(this API server process's index, how many the server has): `(0, 1)`
    with one, which is the serving process itself. vLLM gives each of
    `--api-server-count` N processes its index and N in `ParallelConfig`."""
    parallel = vllm_config.parallel_config
    return max(int(parallel._api_process_rank), 0), int(parallel._api_process_count)
