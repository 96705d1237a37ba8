"""Seam: `vllm/engine/protocol.py`, `EngineClient.check_health`: the engine
check vLLM's own `/health` awaits (`vllm/entrypoints/serve/instrumentator/health.py`),
which raises `EngineDeadError` once the engine core is gone."""

from __future__ import annotations

from typing import Any


async def check_health(engine_client: Any) -> None:
    """vLLM's engine check: returns while the engine is alive, raises otherwise.
    A server without an engine (`engine_client` `None`) is alive, as vLLM says."""
    if engine_client is not None:
        await engine_client.check_health()
