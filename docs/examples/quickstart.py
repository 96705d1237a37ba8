"""Quickstart: make a blocking function awaitable, and pick its strategy."""

import asyncio
import hashlib

import offload


@offload.make_async  # strategy from OFFLOAD_STRATEGY, else "thread"
def digest(data: bytes, rounds: int = 2000) -> str:
    """CPU-bound work that releases the GIL (hashlib does, for large inputs)."""
    for _ in range(rounds):
        data = hashlib.sha256(data).digest()
    return data.hex()


@offload.make_async(strategy="inline")
def digest_on_the_loop(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def main() -> None:
    results = await asyncio.gather(*(digest(bytes([i])) for i in range(8)))
    print(len(results), "digests, first:", results[0][:16])
    print("inline:", (await digest_on_the_loop(b"x"))[:16])

    # An explicit executor: you own it, so close it.
    async with offload.get_executor("thread", max_workers=2) as executor:
        print("run:", await executor.run(pow, 2, 10))


if __name__ == "__main__":
    asyncio.run(main())
