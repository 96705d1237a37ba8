"""pytest-benchmark view of async-renderer's batching: 32 concurrent callers
tokenizing 20-word texts, one tokenizer call per text (`thread`, and
`async-renderer` without a batch form) against `async-renderer` with one.

`make test` runs these once with `--benchmark-disable`; time them with
`pytest benchmarks/tests/test_batching_pytest_benchmark.py --benchmark-enable`.
What the full comparison found, and the commit that reruns it: decision
record 0027.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Any

import pytest

import offload

CALLERS = 32
CALLS = 256  # per timed round, shared by the callers


def _load_tokenizer() -> Any:
    """The packaged all-MiniLM-L6-v2 fast tokenizer (nothing is downloaded)."""
    from tokenizers import Tokenizer

    from benchmarks.harness.models import minilm_dir

    return Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))


def tokenize(text: str) -> list[int]:
    ids: list[int] = offload.worker_state().encode(text).ids
    return ids


def tokenize_batch(texts: list[str]) -> list[list[int]]:
    return [e.ids for e in offload.worker_state().encode_batch(texts)]


TEXTS = [" ".join(random.Random(n).choice(["the", "model", "server", "token", "loop", "batch"]) for _ in range(20))
         for n in range(64)]


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.mark.parametrize(("strategy", "batched"), [("thread", False), ("async-renderer", False),
                                                    ("async-renderer", True)],
                         ids=["thread", "async-renderer", "async-renderer+batch"])
def test_tokenize_under_concurrent_callers(benchmark: Any, loop: asyncio.AbstractEventLoop, strategy: str,
                                           batched: bool) -> None:
    with offload.get_executor(strategy, initializer=_load_tokenizer) as ex:
        encode = offload.make_async(tokenize, executor=ex, batch=tokenize_batch if batched else None)

        async def round_of_calls() -> list[list[int]]:
            queue = list(range(CALLS))
            out: list[list[int]] = [[] for _ in range(CALLS)]

            async def caller() -> None:
                while queue:
                    n = queue.pop()
                    out[n] = await encode(TEXTS[n % len(TEXTS)])

            await asyncio.gather(*(caller() for _ in range(CALLERS)))
            return out

        ids = benchmark(lambda: loop.run_until_complete(round_of_calls()))
        reference = _load_tokenizer()
        assert ids == [reference.encode(TEXTS[n % len(TEXTS)]).ids for n in range(CALLS)]
