"""async-renderer's tokenizer batches on a real server: waves of concurrent
requests, and the batches their tokenization ran in (from /metrics)."""

from __future__ import annotations

import asyncio

import httpx

from ._server import Server, load_client, scrape


def tokenizer_batches(server: Server) -> tuple[float, float]:
    """(calls, batches) of async-renderer's tokenization function so far (the
    executor also builds responses, in batches of their own)."""
    calls = batches = 0.0
    for (name, labels), value in scrape(server).items():
        label = dict(labels)
        if label.get("strategy") != "async-renderer" or "tokenize" not in label.get("function", ""):
            continue
        if name == "offload_batch_size_sum":
            calls += value
        elif name == "offload_batch_size_count":
            batches += value
    return calls, batches


def send_waves(server: Server, waves: int, concurrency: int = 64) -> None:
    """`waves` waves of `concurrency` concurrent one-sentence `/v1/embeddings`
    requests, each wave sent once the last is answered; every answer must be 200."""

    async def run() -> None:
        async with load_client(concurrency) as client:
            for wave in range(waves):
                # A TaskGroup: a failing request stops the others before the client closes.
                async with asyncio.TaskGroup() as group:
                    tasks = [
                        group.create_task(
                            client.post(
                                f"{server.url}/v1/embeddings",
                                json={"model": server.model, "input": f"wave {wave} request {i}: the quick brown fox"},
                            )
                        )
                        for i in range(concurrency)
                    ]
                answers: list[httpx.Response] = [task.result() for task in tasks]
                assert all(a.status_code == 200 for a in answers), [a.status_code for a in answers]

    asyncio.run(run())
