"""A request's engine priority, from its cost and its lane (`OFFLOAD_VLLM_ENGINE_PRIORITY`).

vLLM's `--scheduling-policy priority` runs lower values first, then earlier
arrivals. The adapter gives a request the bit length of its cost divided by
its lane's weight: a request half as costly, or in a lane of twice the
weight, is one level ahead; requests within a factor of two of each other
share a level and keep their arrival order. Levels are >= 0. A request that
sets its own `priority` keeps it (vLLM honours it without the adapter too).
"""

from __future__ import annotations


def engine_priority(cost: float, lane_weight: float) -> int:
    """The engine priority of a request of `cost` in a lane of `lane_weight` (lower runs first)."""
    return int(cost / lane_weight).bit_length()
