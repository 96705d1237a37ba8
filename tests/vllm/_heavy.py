"""A heavy request (seconds of tokenization, little engine work), and one in flight."""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from collections.abc import Iterator

import httpx

from ._server import Server, scrape, total


def heavy_body(model: str) -> dict[str, object]:
    """Long texts cut to 16 tokens: seconds of tokenization (in many pieces)
    on a server that tokenizes them whole (`OFFLOAD_VLLM_PREFIX_TOKENIZE=0`;
    prefix tokenization reads a few hundred characters of each), little
    engine work."""
    return {
        "model": model,
        "input": [f"{i} " + "offload keeps the event loop alive " * 1200 for i in range(64)],
        "truncate_prompt_tokens": 16,
    }


def unbroken_heavy_body(model: str) -> dict[str, object]:
    """As `heavy_body`, but texts with no whitespace: no place to cut, so
    prefix tokenization tokenizes them whole too."""
    return {
        "model": model,
        "input": [f"{i}," + "offload,keeps,the,event,loop,alive," * 1200 for i in range(64)],
        "truncate_prompt_tokens": 16,
    }


@contextlib.contextmanager
def in_flight(server: Server, path: str, body: dict[str, object]) -> Iterator[concurrent.futures.Future[httpx.Response]]:
    """`body` posted to `path` in the background for the block's duration; its
    response at the end. The block starts once the request was admitted (its
    cost is queued) or has finished: a request the block sent earlier could
    take the server's place first and have this one refused."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(httpx.post, f"{server.url}{path}", json=body, timeout=300)
        deadline = time.monotonic() + 120
        while not future.done() and total(scrape(server), "offload_lane_queued_cost") <= 0:
            assert time.monotonic() < deadline, "the request was not admitted in 120 s"
            time.sleep(0.01)
        yield future
        future.result()
