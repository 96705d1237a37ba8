"""A pooling request's phases in its trace, when vLLM's request tracing is on.

vLLM (`--otlp-traces-endpoint`) sets OpenTelemetry's global tracer provider
and, for a request that carries a W3C `traceparent` header, records one span,
`llm_request`, in that trace when the engine finishes it
(`vllm/v1/engine/output_processor.py`, `do_tracing`): the engine's times, not
the API server's. Beside it, in the same trace (the same `traceparent`), the
adapter records `offload_vllm.request`: from the request's arrival at
offload's middleware until its answer's last byte was handed on, with the
phases of `offload_vllm_request_phase_seconds` (`_phases.py`) as attributes
(`offload.phase.<phase>`, seconds) and the moments between them as events.

Only the OpenTelemetry API is used (no vLLM internals): the span goes to
whichever provider is set, vLLM's OTLP exporter when its tracing is on; with
none set, OpenTelemetry's default makes it a no-op. A request without
`traceparent` is not looked at; without the `opentelemetry-api` package,
nothing is recorded.
"""

from __future__ import annotations

import time
from typing import Any, Final

SPAN_NAME: Final = "offload_vllm.request"
#: The span's attribute of each phase, in seconds.
PHASE_ATTRIBUTE: Final = "offload.phase.{}"
TRACE_HEADERS: Final = (b"traceparent", b"tracestate")


def trace_headers(scope: Any) -> dict[str, str] | None:
    """The W3C trace headers of an ASGI request, `None` without `traceparent`."""
    found = {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in scope.get("headers", ())
        if name in TRACE_HEADERS
    }
    return found if "traceparent" in found else None


def record(
    headers: dict[str, str],
    endpoint: str,
    lane: str,
    marks: dict[str, float],
    durations: dict[str, float],
) -> None:
    """Record the span of one request: `marks` are its moments by name
    (`time.perf_counter()`; `arrived` and `sent` begin and end the span),
    `durations` its phases in seconds."""
    try:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return
    # perf_counter's marks as the wall clock's nanoseconds, which spans take.
    offset_ns = time.time_ns() - int(time.perf_counter() * 1e9)

    def wall_ns(mark: float) -> int:
        return offset_ns + int(mark * 1e9)

    span = trace.get_tracer("offload_vllm").start_span(
        SPAN_NAME,
        context=TraceContextTextMapPropagator().extract(headers),
        start_time=wall_ns(marks["arrived"]),
        attributes={
            "http.route": endpoint,
            "offload.lane": lane,
            **{PHASE_ATTRIBUTE.format(phase): seconds for phase, seconds in durations.items()},
        },
    )
    for name, mark in marks.items():
        if name not in ("arrived", "sent") and mark:
            span.add_event(name, timestamp=wall_ns(mark))
    span.end(end_time=wall_ns(marks["sent"]))
