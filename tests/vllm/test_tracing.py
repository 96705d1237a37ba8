"""A request's phases as an OpenTelemetry span (`offload_vllm._tracing`),
without a server: the span recorded into an in-memory exporter. End to end,
beside vLLM's own span, through an OTLP collector: `test_operations.py`."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import pytest
from offload_vllm import _tracing
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # the global provider is set once per process
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    processor = SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    try:
        yield exporter
    finally:
        processor.shutdown()


def test_only_a_request_with_traceparent_is_traced() -> None:
    assert _tracing.trace_headers({"headers": [(b"content-type", b"application/json")]}) is None
    headers = _tracing.trace_headers({"headers": [
        (b"traceparent", f"00-{TRACE_ID}-{PARENT_ID}-01".encode()), (b"tracestate", b"k=v"), (b"x-other", b"1"),
    ]})
    assert headers == {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "tracestate": "k=v"}


def test_the_span_carries_the_phases_in_the_callers_trace(exported: InMemorySpanExporter) -> None:
    now = time.perf_counter()
    marks = {"arrived": now - 0.5, "admitted": now - 0.4, "render_began": now - 0.3, "render_ended": now - 0.2,
             "response_began": now - 0.1, "sent": now}
    durations = {"door": 0.1, "worker_wait": 0.0, "render": 0.1, "engine": 0.1, "response": 0.1}
    _tracing.record({"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}, "/v1/embeddings", "query", marks, durations)
    (span,) = exported.get_finished_spans()
    assert span.name == "offload_vllm.request"
    assert f"{span.context.trace_id:032x}" == TRACE_ID
    assert span.parent is not None
    assert f"{span.parent.span_id:016x}" == PARENT_ID
    assert dict(span.attributes or {}) == {
        "http.route": "/v1/embeddings", "offload.lane": "query",
        **{f"offload.phase.{phase}": seconds for phase, seconds in durations.items()},
    }
    assert [event.name for event in span.events] == ["admitted", "render_began", "render_ended", "response_began"]
    assert span.start_time is not None
    assert span.end_time is not None
    assert abs((span.end_time - span.start_time) / 1e9 - 0.5) < 0.01
    # Each event at its moment, 0.1 s apart.
    stamps = [span.start_time, *(event.timestamp for event in span.events), span.end_time]
    assert all(abs((later - earlier) / 1e9 - 0.1) < 0.01 for earlier, later in itertools.pairwise(stamps))
