"""Seam: the served model's `VllmConfig` (`vllm/config/`), read once, when the executor is built."""

from __future__ import annotations

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
