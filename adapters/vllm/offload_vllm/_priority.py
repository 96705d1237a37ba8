"""A request's engine priority, from its cost and its lane (`OFFLOAD_VLLM_ENGINE_PRIORITY`).

vLLM's `--scheduling-policy priority` runs lower values first, then earlier
arrivals. The adapter gives a request the bit length of its cost divided by
its lane's weight: a request half as costly, or in a lane of twice the
weight, is one level ahead; requests within a factor of two of each other
share a level and keep their arrival order. Levels are >= 0 and at most
`MAX_LEVEL`. A request that sets its own `priority` keeps it (vLLM honours
it without the adapter too).
"""

from __future__ import annotations

import math
import sys

#: The level of a quotient too large for a float (the largest finite float's
#: bit length is `sys.float_info.max_exp`, 1024): the last of all.
MAX_LEVEL = sys.float_info.max_exp + 1


def engine_priority(cost: float, lane_weight: float) -> int:
    """The engine priority of a request of `cost` in a lane of `lane_weight`
    (lower runs first), from 0 to `MAX_LEVEL`; never raises for a cost >= 0
    and a weight > 0, however large or small."""
    ratio = cost / lane_weight
    if math.isnan(ratio) or ratio < 1:
        return 0
    if math.isinf(ratio):
        return MAX_LEVEL
    return int(ratio).bit_length()
