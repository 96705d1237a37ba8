"""Where each admitted request's time went: `offload_vllm_request_phase_seconds`.

A request's life on the API server, in phases, each observed once per
answered request into one histogram, labelled by `endpoint` (the route),
`lane` and `phase`:

- `door`: from the request's arrival at offload's middleware (inside vLLM's
  own and the operator's) until admission took it (`_admission.py`):
  reading and parsing its body, vLLM's validation, waiting for nothing else.
- `worker_wait`: the time its offloaded calls waited for a worker, summed
  (`offload.collect_call_times`).
- `render`: rendering (vLLM's `_preprocessing`), less the time its calls
  waited for a worker.
- `engine`: from the end of rendering until post-processing began: the engine's
  queue and forward pass, and the loop's hand-offs around them.
- `response`: post-processing (building the response) and sending it, until
  its last byte is handed to the server, less the time its calls waited for a
  worker.

On a generate route (chat, completions) `render` is the chat template and
tokenization (and the images' processing), `engine` lasts until the answer's
first byte is sent (for a stream, its first chunk: about the time to first
token), and `response` from there to the last byte: for a stream, the
generation of every token after the first.

A request refused at the door or at admission is observed in no phase (the
refusals have their counters). A phase whose ends were not both seen (a
request that failed, a serving class that renders on its own) is not
observed. With vLLM's request tracing on, the same phases are recorded in the
request's trace too (`_tracing.py`). Everything here runs on the event loop's thread: the marks are
plain attributes of one object per request, kept in a context variable that
the request's task (and nothing else) sees.
"""

from __future__ import annotations

import contextvars
import functools
import time
from collections.abc import Callable, Coroutine
from typing import Any, Final, final

import offload

from . import _tracing
from ._admission import AdmissionListener, Priced
from ._lanes import DEFAULT_LANE
from ._metric_family import once_per_process
from ._routes import is_admitted_request, route_of

PHASE_SECONDS: Final = "offload_vllm_request_phase_seconds"
PHASES: Final = ("door", "worker_wait", "render", "engine", "response")

#: Seconds: from a tenth of a millisecond (a hand-off to an idle worker) to a
#: minute (a request stuck behind a flood), about x2.5 apart, as the core's
#: latency buckets, with 25 s and 60 s added for a door or engine under a flood.
PHASE_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0,
)

_histogram_family = once_per_process(
    lambda prometheus_client: prometheus_client.Histogram(
        PHASE_SECONDS,
        "Time a pooling request spent in each phase on the API server (phase: door, "
        "worker_wait, render, engine, response).",
        ["endpoint", "lane", "phase"],
        buckets=PHASE_BUCKETS,
    )
)


@final
class RequestPhases:
    """One request's marks (`time.perf_counter()`), set on the loop's thread."""

    __slots__ = (
        "admitted",
        "arrived",
        "calls",
        "endpoint",
        "lane",
        "render_began",
        "render_ended",
        "render_waited",
        "response_began",
    )

    def __init__(self, endpoint: str, calls: list[tuple[float, float, float]]) -> None:
        self.endpoint = endpoint
        self.arrived = time.perf_counter()
        self.calls = calls
        self.lane = DEFAULT_LANE
        self.admitted = self.render_began = self.render_ended = self.response_began = 0.0
        self.render_waited = 0.0

    def waited(self, start: int = 0) -> float:
        """Seconds the calls collected from index `start` on waited for a worker."""
        return sum(started - queued for queued, started, _ in self.calls[start:])

    def marks(self, sent: float) -> dict[str, float]:
        """The request's moments by name (0: not seen), its answer sent at `sent`."""
        return {
            "arrived": self.arrived, "admitted": self.admitted, "render_began": self.render_began,
            "render_ended": self.render_ended, "response_began": self.response_began, "sent": sent,
        }

    def durations(self, sent: float) -> dict[str, float]:
        """Each phase whose ends were seen, in seconds, the response sent at `sent`."""
        out: dict[str, float] = {}
        if self.admitted:
            out["door"] = self.admitted - self.arrived
        out["worker_wait"] = self.waited()
        if self.render_began and self.render_ended:
            out["render"] = max(0.0, self.render_ended - self.render_began - self.render_waited)
        if self.render_ended and self.response_began:
            out["engine"] = self.response_began - self.render_ended
        if self.response_began:
            out["response"] = max(0.0, sent - self.response_began - (out["worker_wait"] - self.render_waited))
        return out


_current: contextvars.ContextVar[RequestPhases | None] = contextvars.ContextVar(
    "offload_vllm_request_phases", default=None
)


class _Admitted(AdmissionListener):
    """Marks when admission took the current request, and its lane."""

    def admitted(self, request: Priced) -> None:
        phases = _current.get()
        if phases is not None:
            phases.admitted = time.perf_counter()
            phases.lane = request.lane


#: The phases' listener on admission (`RequestPolicy.subscribe`).
LISTENER: Final = _Admitted()


def timing_render(
    render: Callable[..., Coroutine[Any, Any, Any]],
) -> Callable[..., Coroutine[Any, Any, Any]]:
    """`render` (vLLM's `_preprocessing`, as the adapter runs it), marking the
    current request's rendering phase."""

    @functools.wraps(render)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        phases = _current.get()
        if phases is None:
            return await render(*args, **kwargs)
        phases.render_began = time.perf_counter()
        before = len(phases.calls)
        result = await render(*args, **kwargs)
        phases.render_ended = time.perf_counter()
        phases.render_waited = phases.waited(before)
        return result

    return timed


def timing_response(
    postprocess: Callable[..., Coroutine[Any, Any, Any]],
) -> Callable[..., Coroutine[Any, Any, Any]]:
    """`postprocess` (a serving object's `_postprocessing_async`), marking
    when the current request's response phase began."""

    @functools.wraps(postprocess)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        phases = _current.get()
        if phases is not None:
            phases.response_began = time.perf_counter()
        return await postprocess(*args, **kwargs)

    return timed


class TimePhases:
    """ASGI middleware: keeps a `RequestPhases` for each POST to a pooling or
    generate route, and observes its phases once the last byte of its answer is handed
    on. Outermost of offload's middleware, so the door phase counts from
    before the early refusal's check."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._family = _histogram_family() if offload.metrics_enabled() else None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        family = self._family
        if family is None or not is_admitted_request(scope):
            await self.app(scope, receive, send)
            return
        traced = _tracing.trace_headers(scope)
        with offload.collect_call_times() as calls:
            phases = RequestPhases(route_of(scope), calls)
            token = _current.set(phases)

            async def send_observed(message: Any) -> None:
                if message["type"] == "http.response.start" and not phases.response_began:
                    phases.response_began = time.perf_counter()  # a generate route's answer: its first byte
                await send(message)
                last = message["type"] == "http.response.body" and not message.get("more_body", False)
                if last and phases.admitted:
                    sent = time.perf_counter()
                    lane = phases.lane
                    durations = phases.durations(sent)
                    for phase, seconds in durations.items():
                        family.labels(phases.endpoint, lane, phase).observe(seconds)
                    if traced is not None:
                        _tracing.record(traced, phases.endpoint, lane, phases.marks(sent), durations)

            try:
                await self.app(scope, receive, send_observed)
            finally:
                _current.reset(token)
