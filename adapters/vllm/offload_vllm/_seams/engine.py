"""Seam: `vllm/engine/protocol.py`, `EngineClient.check_health`: the engine
check vLLM's own `/health` awaits (`vllm/entrypoints/serve/instrumentator/health.py`),
which raises `EngineDeadError` once the engine core is gone; and the
engine's `--max-num-queued-reqs` (`vllm/config/scheduler.py`), which
`AsyncLLM.check_admission` (`vllm/v1/engine/async_llm.py`) holds engine
requests to as rendering hands them over."""

from __future__ import annotations

from typing import Any


async def check_health(engine_client: Any) -> None:
    """vLLM's engine check: returns while the engine is alive, raises otherwise.
    A server without an engine (`engine_client` `None`) is alive, as vLLM says."""
    if engine_client is not None:
        await engine_client.check_health()


def max_num_queued_reqs(engine_client: Any) -> int | None:
    """vLLM's `--max-num-queued-reqs` for `engine_client` (`None`: not set, or no engine)."""
    config = getattr(engine_client, "vllm_config", None)
    scheduler = getattr(config, "scheduler_config", None)
    limit = getattr(scheduler, "max_num_queued_reqs", None)
    return limit if isinstance(limit, int) else None
