"""Under `process`: a renderer worker killed mid-load fails its own requests cleanly
(5xx with an error body), and the server keeps serving."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest

from ._server import Server, load_client, renderer_workers
from .conftest import AVAILABLE

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(900),
    pytest.mark.skipif("process" not in AVAILABLE, reason="no process server: offload lacks it or OFFLOAD_TEST_VLLM_STRATEGIES leaves it out"),
]


def wait_for_workers(server: Server, count: int, timeout: float = 180) -> list[int]:
    """The ready workers' pids once there are `count` of them."""
    deadline = time.monotonic() + timeout
    while len(pids := sorted(p.pid for p in renderer_workers(server))) != count:
        assert time.monotonic() < deadline, f"{len(pids)} ready workers after {timeout} s, not {count}"
        time.sleep(0.2)
    return pids


async def _load_then_kill(server: Server) -> tuple[int, list[httpx.Response]]:
    text = " ".join(["a renderer worker dies while rendering this"] * 20)
    async with load_client(64) as client:

        async def one(i: int) -> httpx.Response:
            return await client.post(
                f"{server.url}/v1/embeddings", json={"model": server.model, "input": [f"{i} {text}"] * 8}
            )

        tasks = [asyncio.create_task(one(i)) for i in range(48)]
        await asyncio.sleep(0.3)
        # A regular worker (below the loop's priority), busy under this load;
        # the express worker (on by default, at the loop's) may be idle.
        victims = sorted(renderer_workers(server), key=lambda p: -p.nice())
        assert victims, "no renderer worker process found"
        os.kill(victims[0].pid, signal.SIGKILL)
        return victims[0].pid, await asyncio.gather(*tasks)


def test_killed_renderer_worker(servers: dict[tuple[str | None, str], Server]) -> None:
    server = servers[("process", "embed")]
    # Warm up: workers exist once they have rendered.
    assert httpx.post(f"{server.url}/v1/embeddings", json={"model": server.model, "input": "hi"}, timeout=120).status_code == 200
    victim, responses = asyncio.run(_load_then_kill(server))
    for r in responses:
        assert r.status_code == 200 or 500 <= r.status_code < 600, r.status_code
        if r.status_code != 200:
            assert "error" in r.json(), r.text
    assert server.alive(), server.log_tail()
    # The killed worker is replaced at once, not when a call needs it.
    assert victim not in wait_for_workers(server, 3), "the killed worker is still listed"
    for _ in range(10):
        r = httpx.post(f"{server.url}/v1/embeddings", json={"model": server.model, "input": ["after", "the crash"]}, timeout=120)
        assert r.status_code == 200, r.text
    assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
