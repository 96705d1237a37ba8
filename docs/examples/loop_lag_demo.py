"""Demo: the same CPU-heavy endpoint served under each strategy, and the event loop's lag.

A tiny HTTP server (asyncio streams, loopback only) answers `GET /work` by
running a blocking, CPU-heavy function, and `GET /health` at once. A client
sends bounded concurrent /work requests while probing /health; a
`LoopLagMonitor` inside the server shows how late its loop woke up.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
import time

import offload

DEMO_STRATEGIES = [s for s in ("inline", "thread", "process") if s in offload.STRATEGIES]
REQUESTS = 32 if "--quick" not in sys.argv else 8
CONCURRENCY = 8


def heavy(seed: int) -> str:
    """About 20 ms of hashing (hashlib releases the GIL on large buffers)."""
    data = bytes([seed % 256]) * 1_000_000
    for _ in range(10):
        data = hashlib.sha256(data).digest() * 31_250
    return hashlib.sha256(data).hexdigest()


async def serve(executor: offload.Executor) -> tuple[asyncio.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        body = (await executor.run(heavy, 7)) if line.startswith(b"GET /work") else "ok"
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}".encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def get(port: int, path: str) -> float:
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    await reader.read()
    writer.close()
    return time.perf_counter() - start


async def measure(strategy: str) -> str:
    options = {"max_workers": 2} if strategy in ("thread", "process") else {}
    async with offload.get_executor(strategy, **options) as executor:
        await executor.run(heavy, 0)  # warm up (starts the worker processes for `process`)
        server, port = await serve(executor)
        health: list[float] = []
        async with server, offload.LoopLagMonitor(interval=0.001) as lag:
            semaphore = asyncio.Semaphore(CONCURRENCY)

            async def work() -> None:
                async with semaphore:
                    await get(port, "/work")

            async def probe(done: asyncio.Event) -> None:
                while not done.is_set():
                    health.append(await get(port, "/health"))
                    await asyncio.sleep(0.005)

            done = asyncio.Event()
            prober = asyncio.create_task(probe(done))
            start = time.perf_counter()
            await asyncio.gather(*(work() for _ in range(REQUESTS)))
            elapsed = time.perf_counter() - start
            done.set()
            await prober
    health.sort()
    p99 = health[min(len(health) - 1, int(len(health) * 0.99))]
    return (
        f"{strategy:8} {REQUESTS / elapsed:7.1f} req/s   loop lag p50 {lag.p50 * 1e3:6.2f} ms  "
        f"p99 {lag.p99 * 1e3:7.2f} ms   /health p99 {p99 * 1e3:7.2f} ms"
    )


async def main() -> None:
    print(f"{REQUESTS} CPU-heavy requests, {CONCURRENCY} at a time, /health probed meanwhile:")
    for strategy in DEMO_STRATEGIES:
        print(await measure(strategy))


if __name__ == "__main__":
    asyncio.run(main())
