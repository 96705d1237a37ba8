"""The adapter's own metric: calls run on the event loop instead of on a worker.

A call priced at most `OFFLOAD_VLLM_INLINE_COST` runs on the event loop with
vLLM's own objects (`_placements/base.py`); it is no executor call, so the
`offload_*` call metrics do not see it. `offload_vllm_loop_calls_total{call}`
counts such calls, `call` being `render` (a prompt, or a request's prompts
together) or `postprocess` (a response). It lives in `prometheus_client`'s
default registry, beside the core's families, and is off where they are
(`offload.metrics_enabled()`, read when a placement is built, as an executor
reads it when it is built).
"""

from __future__ import annotations

from typing import Any, Final, Literal

import offload

from ._metric_family import once_per_process

LOOP_CALLS: Final = "offload_vllm_loop_calls"

LoopCall = Literal["render", "postprocess"]

_counter_family = once_per_process(
    lambda prometheus_client: prometheus_client.Counter(
        LOOP_CALLS,
        "Calls priced at most OFFLOAD_VLLM_INLINE_COST that ran on the event loop "
        "instead of on a worker (call: render, postprocess).",
        ["call"],
    )
)


def loop_call_counters() -> dict[LoopCall, Any] | None:
    """Each kind of call's counter, looked up once so that counting a call is
    one `inc()`; None when metrics are off. Every series shows on `/metrics`
    from here on, at 0 until a call of its kind runs on the loop."""
    if not offload.metrics_enabled():
        return None
    family = _counter_family()
    return {"render": family.labels("render"), "postprocess": family.labels("postprocess")}
