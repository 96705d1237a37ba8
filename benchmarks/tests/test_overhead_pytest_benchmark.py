"""pytest-benchmark view of the per-call overhead (`pytest benchmarks`).

`make test` runs these once with `--benchmark-disable`; run them for real with
`pytest benchmarks --benchmark-only`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator
from typing import Any

import pytest

import offload
from benchmarks.suites.overhead import WORKERS, noop


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        yield pool


def _bench(benchmark: Any, loop: asyncio.AbstractEventLoop, make_coro: Any) -> None:
    async def hundred() -> None:
        for _ in range(100):
            await make_coro()

    benchmark(lambda: loop.run_until_complete(hundred()))


@pytest.mark.parametrize("strategy", ["inline", "thread"])
def test_offload_noop(benchmark: Any, loop: asyncio.AbstractEventLoop, strategy: str) -> None:
    options = {"max_workers": WORKERS} if strategy == "thread" else {}
    with offload.get_executor(strategy, **options) as ex:
        _bench(benchmark, loop, lambda: ex.run(noop))


def test_run_in_executor_noop(benchmark: Any, loop: asyncio.AbstractEventLoop, pool: concurrent.futures.ThreadPoolExecutor) -> None:
    _bench(benchmark, loop, lambda: loop.run_in_executor(pool, noop))


def test_asyncio_to_thread_noop(benchmark: Any, loop: asyncio.AbstractEventLoop) -> None:
    _bench(benchmark, loop, lambda: asyncio.to_thread(noop))
