"""Lanes, flows and costs: a small request is not stuck behind a large one.

One worker; a large request (eight pieces of work, one flow) is queued first,
then a small one. The small one runs right after the call already running,
not after the large request's eight pieces. Then the cost bound refuses work
before anything is done for it.
"""

from __future__ import annotations

import time

import anyio

import offload


def tokenize(text: str) -> int:
    time.sleep(len(text) / 200_000)  # stands for real work proportional to the text
    return len(text.split())


async def large_request(executor: offload.Executor, texts: list[str], finished: list[str]) -> None:
    # One unit of work: admitted once, its calls one flow, each call its own cost.
    with executor.admission("large", cost=sum(map(len, texts)), lane="ingest"):
        async with anyio.create_task_group() as tg:
            for text in texts:
                tg.start_soon(executor.options(cost=len(text)).run, tokenize, text)
    finished.append("large request")


async def small_request(executor: offload.Executor, text: str, finished: list[str]) -> None:
    with executor.admission("small", cost=len(text), lane="query"):
        await executor.options(cost=len(text)).run(tokenize, text)
    finished.append("small request")


async def main() -> None:
    executor = offload.get_executor(
        "thread", max_workers=1, lanes={"query": 4, "ingest": 1}, max_queued_cost=200_000
    )
    finished: list[str] = []
    async with executor, anyio.create_task_group() as tg:
        tg.start_soon(large_request, executor, ["lorem ipsum " * 2_000] * 8, finished)
        await anyio.sleep(0.01)  # the large request's pieces are queued
        tg.start_soon(small_request, executor, "hello world", finished)
    print("finished in this order:", finished)
    assert finished == ["small request", "large request"]

    # The bound counts cost admitted and not started: a request that would
    # take it over 200_000 is refused at once, before anything is done for it.
    executor = offload.get_executor("thread", max_workers=1, max_queued_cost=200_000)
    async with executor:
        with executor.admission("first", cost=150_000):
            try:
                with executor.admission("second", cost=100_000):
                    pass
            except offload.Overloaded as exc:
                print("refused:", exc)


if __name__ == "__main__":
    anyio.run(main)
