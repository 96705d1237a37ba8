"""Fail fast instead of queueing without bound, with deadlines and metrics."""

import time

import anyio
from prometheus_client import generate_latest

import offload


def render(text: str) -> str:
    time.sleep(0.05)  # stands in for tokenizing a long prompt
    return text.upper()


async def main() -> None:
    # 2 workers, and at most 4 calls waiting for them: the 7th call in flight fails at once.
    executor = offload.get_executor("thread", max_workers=2, max_queue=4)
    async with anyio.create_task_group() as tg:
        tg.start_soon(offload.sample_loop_lag, "example")  # offload_loop_lag_seconds{loop="example"}
        outcomes: list[str] = []

        async def request(i: int) -> None:
            try:
                outcomes.append(await executor.run_with_timeout(2.0, render, f"request {i}"))
            except offload.Overloaded:
                outcomes.append("503")  # a server answers 503 + Retry-After here
            except TimeoutError:
                outcomes.append("504")

        async with anyio.create_task_group() as clients:
            for i in range(10):
                clients.start_soon(request, i)
        print(f"{outcomes.count('503')} of 10 refused at once, {len(outcomes) - outcomes.count('503')} served")

        # A server refusing a whole request before parsing it:
        try:
            with executor.admission("example.request"):
                print(await executor.run(render, "admitted request"))
        except offload.Overloaded:
            print("refused")

        await executor.aclose(timeout=5.0)  # graceful: queued calls fail, running ones finish
        tg.cancel_scope.cancel()

    for line in generate_latest().decode().splitlines():
        if line.startswith(("offload_rejected_calls_total", "offload_run_seconds_count")):
            print(line)


anyio.run(main)
