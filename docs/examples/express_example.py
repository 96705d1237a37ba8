"""The express worker: a cheap call does not wait for a long call already running.

One regular worker, busy with a long call (a large image, say), and the
express worker (`express_cost=`), which takes only calls priced at most
1,000. A cheap call arrives: with the express worker it is answered while
the long call still runs; without, it waits for it.
"""

from __future__ import annotations

import threading
import time

import anyio

import offload


def decode(size: int, running: threading.Event | None = None) -> int:
    if running is not None:
        running.set()
    time.sleep(size / 10_000)  # stands for work proportional to the input
    return size


async def wait_for_cheap_call(express_cost: float) -> float:
    executor = offload.get_executor("thread", max_workers=1, express_cost=express_cost)
    async with executor, anyio.create_task_group() as tg:
        running = threading.Event()
        tg.start_soon(executor.options(cost=5_000).run, decode, 5_000, running)  # 0.5 s
        # Once the long call runs: queued beside it, the cheaper call would go first.
        await anyio.to_thread.run_sync(running.wait)
        began = time.perf_counter()
        await executor.options(cost=100).run(decode, 100)  # 0.01 s
        return time.perf_counter() - began


async def main() -> None:
    with_express = await wait_for_cheap_call(express_cost=1_000)
    without = await wait_for_cheap_call(express_cost=0)
    print(f"cheap call answered in {with_express * 1000:.0f} ms with the express worker, "
          f"{without * 1000:.0f} ms without")
    assert with_express < 0.3 < without  # without, it waited for the long call


if __name__ == "__main__":
    anyio.run(main)
