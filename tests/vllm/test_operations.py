"""What operators plug in, on a real server: the health port (liveness and
readiness off the event loop), the computed `Retry-After`, the request phase
histograms, and the Grafana dashboard's metrics.

One `thread` server of its own (one worker, a cost bound, the health port,
vLLM's request tracing exported to a collector here, a test middleware that
blocks the loop on request): the settings are the subject. Its last test
kills its engine.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import http.server
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ._module_servers import ModuleServers, register
from ._server import Server, free_port, scrape, start_server, total

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "adapters" / "vllm" / "grafana" / "offload.json"
MAX_QUEUED_COST = 20_000
MAX_STALL_S = 2.0
PHASES = ("door", "worker_wait", "render", "engine", "response")
# Holds the one worker for seconds: one prompt of 4 M characters, tokenized whole.
HOLD = {"input": "offload keeps the event loop alive " * 115_000, "truncate_prompt_tokens": 16}


class _Collector(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP trace collector on 127.0.0.1: keeps every span posted to `/v1/traces`."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        super().__init__(("127.0.0.1", 0), _Receive)


class _Receive(http.server.BaseHTTPRequestHandler):
    server: _Collector

    def do_POST(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        exported = ExportTraceServiceRequest.FromString(self.rfile.read(int(self.headers["Content-Length"])))
        for resource in exported.resource_spans:
            for scope in resource.scope_spans:
                self.server.spans.extend(scope.spans)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return


#: The module's trace collector: started with its server (`starts`, called
#: before the module runs, with the other modules' servers), stopped after it.
_collectors: list[_Collector] = []


def _start_collector() -> _Collector:
    receiver = _Collector()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    _collectors.append(receiver)
    return receiver


@pytest.fixture(scope="module")
def collector(server: Server) -> Iterator[_Collector]:
    receiver = _collectors[-1]
    try:
        yield receiver
    finally:
        receiver.shutdown()
        receiver.server_close()


# Needs no strategy from OFFLOAD_TEST_VLLM_STRATEGIES: the module always runs (its settings are the subject).
@register(__name__, needs=(), servers=1)
def starts(model_dirs: Mapping[str, Path], log_dir: Path) -> dict[str, Callable[[], Server]]:
    collector = _start_collector()
    env = {
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        # The span exporter's batch every 0.5 s (OpenTelemetry's default: 5 s), so the trace test waits less.
        "OTEL_BSP_SCHEDULE_DELAY": "500",
        "OFFLOAD_VLLM_HEALTH_PORT": str(free_port()),
        "OFFLOAD_VLLM_HEALTH_MAX_STALL": str(MAX_STALL_S),
        "OFFLOAD_VLLM_MAX_QUEUED_COST": str(MAX_QUEUED_COST),
        # The hold above takes seconds only tokenized whole, on the one worker.
        "OFFLOAD_VLLM_PREFIX_TOKENIZE": "0",
        "OFFLOAD_VLLM_INLINE_COST": "0",
        "OFFLOAD_VLLM_EXPRESS_COST": "0",
        # The test middleware's module, importable in the server.
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
    }
    args = (
        "--middleware", "tests.vllm.operator_middleware.BlockLoop",
        "--otlp-traces-endpoint", f"http://127.0.0.1:{collector.server_address[1]}/v1/traces",
    )
    start = lambda: start_server(  # noqa: E731
        model_dirs["embed"], "minilm", "thread", log_dir, workers=1,
        extra_env=env, extra_args=args,
    )
    return {"operations": start}


@pytest.fixture(scope="module")
def server(module_servers: ModuleServers) -> Iterator[Server]:
    with module_servers.taken(__name__) as started:
        yield started["operations"]


@pytest.fixture(scope="module")
def health_port(server: Server) -> int:
    """The server's health port, as its process was given it."""
    return int(server.env["OFFLOAD_VLLM_HEALTH_PORT"])


def probe(port: int, path: str) -> tuple[int, dict[str, Any], float]:
    """`(status, JSON body, seconds)` of a GET on the health port."""
    began = time.perf_counter()
    response = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=10)
    return response.status_code, response.json(), time.perf_counter() - began


def embed(server: Server, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/embeddings", json={"model": server.model, **body}, timeout=300)


def test_the_health_port_answers_and_vllms_health_still_does(server: Server, health_port: int) -> None:
    code, body, _ = probe(health_port, "/health")
    assert (code, body["status"]) == (200, "ok"), body
    assert body["loop_turned_seconds_ago"] < MAX_STALL_S
    assert body["engine_checked_seconds_ago"] is not None
    code, body, _ = probe(health_port, "/ready")
    assert (code, body["status"]) == (200, "ready"), body
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_each_phase_of_a_request_is_on_metrics(server: Server) -> None:
    """Every phase of an answered request is observed once, labelled by
    endpoint and lane, and the phases of a request run alone add up to no
    more than its client saw."""
    before = scrape(server)
    began = time.perf_counter()
    for _ in range(3):
        assert embed(server, {"input": "where did the time go " * 50}).status_code == 200
    client_seconds = time.perf_counter() - began
    after = scrape(server)
    labels = {"endpoint": "/v1/embeddings", "lane": "default"}
    phase_seconds = 0.0
    for phase in PHASES:
        name = "offload_vllm_request_phase_seconds"
        count = total(after, f"{name}_count", phase=phase, **labels) - total(before, f"{name}_count", phase=phase, **labels)
        assert count == 3, phase
        phase_seconds += total(after, f"{name}_sum", phase=phase, **labels) - total(before, f"{name}_sum", phase=phase, **labels)
    assert 0 < phase_seconds <= client_seconds


def test_each_phase_of_a_traced_request_is_in_its_trace(server: Server, collector: _Collector) -> None:
    """With vLLM's request tracing on, a request that carries `traceparent`
    gets, in its trace, vLLM's own `llm_request` span and offload's span with
    every phase (seconds) and the moments between them."""
    trace_id = os.urandom(16)
    parent = f"00-{trace_id.hex()}-{os.urandom(8).hex()}-01"
    response = httpx.post(
        f"{server.url}/v1/embeddings", json={"model": server.model, "input": "a traced request"},
        headers={"traceparent": parent}, timeout=300,
    )
    assert response.status_code == 200
    deadline = time.monotonic() + 30  # the exporter sends its batch every 0.5 s (OTEL_BSP_SCHEDULE_DELAY)
    while True:
        spans = {span.name: span for span in list(collector.spans) if span.trace_id == trace_id}
        if {"llm_request", "offload_vllm.request"} <= set(spans) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert set(spans) >= {"llm_request", "offload_vllm.request"}, [s.name for s in collector.spans]
    ours = spans["offload_vllm.request"]
    attributes = {a.key: a.value for a in ours.attributes}
    for phase in PHASES:
        assert attributes[f"offload.phase.{phase}"].double_value >= 0.0, phase
    assert attributes["offload.lane"].string_value == "default"
    assert attributes["http.route"].string_value == "/v1/embeddings"
    assert [event.name for event in ours.events] == ["admitted", "render_began", "render_ended", "response_began"]
    # offload's span covers the engine's: it begins before and ends after.
    engine = spans["llm_request"]
    assert ours.start_time_unix_nano <= engine.start_time_unix_nano
    assert ours.end_time_unix_nano >= engine.end_time_unix_nano


#: Admission decisions by what `/ready` answered then (`offload_vllm._health.READINESS_AT_ADMISSION`).
DECISIONS = "offload_vllm_readiness_at_admission_total"


def decisions(server: Server) -> dict[tuple[str, str], float]:
    """`(decision, ready)` -> admission decisions counted so far."""
    values = scrape(server)
    return {
        (decision, ready): total(values, DECISIONS, decision=decision, ready=ready)
        for decision in ("admitted", "refused")
        for ready in ("200", "503")
    }


def test_readiness_and_retry_after_while_the_bound_is_full(server: Server, health_port: int) -> None:
    """One request costlier than the bound holds the one worker and, until it
    is answered, the whole bound: the next is refused with a `Retry-After`
    from 1 to 30 s, and readiness says 503 naming admission meanwhile (and is
    counted so at its refusal); 200 again once the first is answered."""
    counted_before = decisions(server)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        holding = pool.submit(embed, server, HOLD)
        deadline = time.monotonic() + 120
        while total(scrape(server), "offload_lane_queue_wait_seconds_count", lane="default") < 1 or total(
            scrape(server), "offload_running_calls"
        ) < 1:
            assert time.monotonic() < deadline, "the holding request did not start"
            assert not holding.done(), holding.result().text[:300]
            time.sleep(0.02)
        held = total(scrape(server), "offload_vllm_admitted_requests")
        refused = embed(server, {"input": "refused"})
        code, body, _ = probe(health_port, "/ready")
        assert not holding.done(), "the bound emptied before the checks: make HOLD longer"
        assert holding.result().status_code == 200
    assert held == 1, held
    assert refused.status_code == 503
    assert 1 <= int(refused.headers["retry-after"]) <= 30
    assert code == 503, body
    assert body["reason"].startswith("admission refuses"), body
    assert probe(health_port, "/health")[0] == 200  # full is alive
    deadline = time.monotonic() + 5
    while probe(health_port, "/ready")[0] != 200:
        assert time.monotonic() < deadline, "readiness did not come back"
        time.sleep(0.05)
    counted = {key: n - counted_before[key] for key, n in decisions(server).items()}
    # One admitted (whatever readiness said then), and the refusal while 503 was published.
    assert counted[("admitted", "200")] + counted[("admitted", "503")] == 1, counted
    assert (counted[("refused", "200")], counted[("refused", "503")]) == (0, 1), counted


def test_each_admission_decision_is_counted_with_what_readiness_answered(server: Server) -> None:
    """A flood of requests each costlier than the bound (so each is admitted
    only into an empty bound, and fills it): every admission decision is
    counted once, admitted ones as many as the 200s and refused ones as the
    503s; refusals are counted with `/ready` at 503, and admissions into the
    idle server with 200. Waves of 16 until both are seen (10 at most)."""
    flood = {"input": "a flooding request " * 1_400, "truncate_prompt_tokens": 16}  # 26,600 > the bound
    before = decisions(server)
    statuses: collections.Counter[int] = collections.Counter()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        for _ in range(10):
            statuses.update(response.status_code for response in pool.map(lambda _: embed(server, flood), range(16)))
            counted = {key: n - before[key] for key, n in decisions(server).items()}
            if counted[("refused", "503")] and counted[("admitted", "200")]:
                break
    assert set(statuses) <= {200, 503}, statuses
    assert counted[("admitted", "200")] + counted[("admitted", "503")] == statuses[200], (counted, statuses)
    assert counted[("refused", "200")] + counted[("refused", "503")] == statuses[503], (counted, statuses)
    assert counted[("refused", "503")] >= 1, (counted, statuses)
    assert counted[("admitted", "200")] >= 1, (counted, statuses)


def test_the_dashboard_queries_only_metrics_the_server_exports(server: Server) -> None:
    # Every family has a series once requests ran (the tests above); an
    # admission decision shows every series of the readiness-at-admission count.
    assert embed(server, {"input": "one more decision"}).status_code == 200
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    exported = {s.name for family in text_string_to_metric_families(text) for s in family.samples}
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    queried = {name for query in queries for name in re.findall(r"\b(offload_[a-z_]+)\b", query)}
    assert len(queried) >= 9
    assert DECISIONS in queried  # readiness at admission has its panels
    assert queried - exported == set()


def test_a_blocked_loop_is_reported_within_twice_the_bound(server: Server, health_port: int) -> None:
    """The loop blocked for 10 s: liveness turns 503, naming the loop, within
    2x `OFFLOAD_VLLM_HEALTH_MAX_STALL` of the block's start, every probe
    answered meanwhile, by the health process, well within 1 s; 200 again after."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        sent = time.monotonic()
        blocking = pool.submit(httpx.post, f"{server.url}/offload-test/block-loop?seconds=10", timeout=60)
        seen: list[tuple[float, int, str, float]] = []
        while time.monotonic() - sent < 8:
            code, body, took = probe(health_port, "/health")
            seen.append((time.monotonic() - sent, code, body.get("reason", ""), took))
            time.sleep(0.1)
        assert blocking.result().status_code == 200
    unhealthy = [at for at, code, reason, _ in seen if code == 503 and "event loop" in reason]
    assert unhealthy, seen
    assert unhealthy[0] <= 2 * MAX_STALL_S, seen
    assert max(took for *_, took in seen) < 1.0, seen
    deadline = time.monotonic() + 5
    while probe(health_port, "/health")[0] != 200:
        assert time.monotonic() < deadline, "liveness did not come back"
        time.sleep(0.05)


def _health_processes(server: Server) -> list[psutil.Process]:
    return [
        p for p in psutil.Process(server.proc.pid).children(recursive=True)
        if any(part.endswith("_health_answer.py") for part in p.cmdline())
    ]


def test_a_killed_health_process_is_started_again(server: Server, health_port: int) -> None:
    """SIGKILL the server's health process: the health port answers 200 again
    within 10 s, from a new process (the server logs the restart)."""
    [answering] = _health_processes(server)
    answering.kill()
    began = time.monotonic()
    with contextlib.suppress(psutil.NoSuchProcess):
        while answering.status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() - began < 10
            time.sleep(0.01)
    code, body, _ = probe(health_port, "/health")
    assert code == 200, body
    assert time.monotonic() - began < 10
    assert [p.pid for p in _health_processes(server) if p.status() != psutil.STATUS_ZOMBIE] not in ([], [answering.pid])


def test_a_dead_engine_is_reported(server: Server, health_port: int) -> None:
    """The engine core killed: liveness turns 503, naming the engine, before
    vLLM stops the server (its watchdog does within seconds). Last: the
    server is gone after it."""
    engines = [
        p for p in psutil.Process(server.proc.pid).children(recursive=True)
        if "EngineCore" in " ".join(p.cmdline()) or "EngineCore" in p.name()
    ]
    assert engines, [p.cmdline() for p in psutil.Process(server.proc.pid).children(recursive=True)]
    for engine in engines:
        engine.kill()
    deadline = time.monotonic() + 30
    while True:
        assert time.monotonic() < deadline, "the dead engine was never reported"
        try:
            code, body, _ = probe(health_port, "/health")
        except httpx.HTTPError:
            pytest.fail("the server stopped before its health port reported the dead engine")
        if code == 503:
            assert body["reason"].startswith("the engine is not alive"), body
            break
        time.sleep(0.05)
