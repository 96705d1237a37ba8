"""async-renderer's batching window on a real server: a batch waits only
while other requests are in flight (past the door, not yet answered), so a
lone request does not wait, and one beside another request in flight does.
How big batches get under load is benchmarks/calibration/batch_wait.py's to measure.

The window here is the longest the setting takes (1 s), so that a lone request
held for it could not be mistaken for a slow one: answers are expected in
milliseconds, and the checks allow half a second.
"""

from __future__ import annotations

import asyncio
import functools
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import httpx
import pytest

from ._module_servers import ModuleServers, register
from ._server import Server, start_server
from .conftest import AVAILABLE

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(600),
    pytest.mark.skipif("async-renderer" not in AVAILABLE, reason="needs the async-renderer strategy"),
]

WINDOW_S = 1.0
#: A lone request held for the window would take at least WINDOW_S.
LONE_LIMIT_S = WINDOW_S / 2


@register(__name__, needs=("async-renderer",), servers=1)
def starts(model_dirs: Mapping[str, Path], log_dir: Path) -> dict[str, Callable[[], Server]]:
    start = functools.partial(
        start_server, model_dirs["embed"], "minilm", "async-renderer", log_dir,
        extra_args=("--offload-batch-wait", str(WINDOW_S)),
    )
    return {"window": start}


@pytest.fixture(scope="module")
def server(module_servers: ModuleServers) -> Iterator[Server]:
    with module_servers.taken(__name__) as started:
        yield started["window"]


def embed(server: Server, text: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/embeddings", json={"model": server.model, "input": text}, timeout=60)


def lone_latencies(server: Server, n: int = 7) -> list[float]:
    """`n` requests one after another: their latencies, in seconds."""
    latencies = []
    for i in range(n):
        began = time.perf_counter()
        assert embed(server, f"a lone request {i}").status_code == 200
        latencies.append(time.perf_counter() - began)
    return latencies


def test_a_lone_request_does_not_wait_for_the_window(server: Server) -> None:
    embed(server, "warm up")
    latencies = lone_latencies(server)
    assert statistics.median(latencies) < LONE_LIMIT_S, latencies


def test_a_batch_waits_while_another_request_is_in_flight(server: Server) -> None:
    """A request whose body has not all arrived is in flight (counted from
    the door): a lone request's batch waits the window for it. Once its client
    has gone, lone requests start at once again."""
    embed(server, "warm up")

    async def beside_a_stalled_request() -> tuple[list[float], list[float]]:
        host, port = server.url.removeprefix("http://").split(":")
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 1000\r\n\r\n{\"model\": "
        )
        await writer.drain()
        await asyncio.sleep(0.5)  # the server has read its headers: it is in flight
        beside = await asyncio.to_thread(lone_latencies, server, 3)
        writer.close()
        await writer.wait_closed()
        await asyncio.sleep(0.5)
        after = await asyncio.to_thread(lone_latencies, server, 3)
        return beside, after

    beside, after = asyncio.run(beside_a_stalled_request())
    assert min(beside) >= LONE_LIMIT_S, beside
    assert statistics.median(after) < LONE_LIMIT_S, after


def test_requests_that_fail_or_are_left_are_not_counted_in_flight(server: Server) -> None:
    """Requests that end before they render (a body that is not JSON, one
    that fails validation, a client that disconnects mid-body) are no longer
    counted in flight: lone requests after them still do not wait."""
    for content in (b"{not json", b'{"model": "minilm", "input": {"not": "a prompt"}}'):
        r = httpx.post(
            f"{server.url}/v1/embeddings", content=content, headers={"content-type": "application/json"}, timeout=60
        )
        assert r.status_code == 400, r.text[:200]

    async def disconnect_mid_body() -> None:
        reader, writer = await asyncio.open_connection(*server.url.removeprefix("http://").split(":"))
        writer.write(
            b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 1000\r\n\r\n{\"model\": "
        )
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.close()
        await writer.wait_closed()
        del reader

    for _ in range(3):
        asyncio.run(disconnect_mid_body())
    time.sleep(0.5)
    latencies = lone_latencies(server)
    assert statistics.median(latencies) < LONE_LIMIT_S, latencies
