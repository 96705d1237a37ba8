"""Benchmark of the `process` strategy against `inline`, `thread` and the
standard library's `ProcessPoolExecutor` (through `loop.run_in_executor`).

    python -m benchmarks process [--smoke] [--out DIR]

Writes `process.json` and `process.md` to DIR (default `.benchmarks/runs/process`).
Four parts, all in one run on asyncio:

1. Calls/s and event-loop lag (`LoopLagMonitor`, p50/p99) at concurrency 1, 2,
   8 and 32 for a GIL-bound pure-Python function and for image preprocessing
   (JPEG decode, resize, normalise to a float array, as a multimodal embedding
   model's processor does).
2. Per-call overhead of a no-op, `process` against the stdlib pool.
3. Round-trip time of a float64 array of 1 KiB .. 32 MiB, with shared memory
   and through the pipe only.
4. The process strategy's targets, met or missed.

Every pool has 2 workers and uses the `forkserver` start method.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

import offload
from benchmarks.harness import common as _common
from benchmarks.harness import progress

WORKERS = 2
CONCURRENCY = (1, 2, 8, 32)


# ---- the work (module level, so it pickles) --------------------------------------


def gil_work(n: int) -> int:
    """Pure-Python arithmetic: holds the GIL for its whole run."""
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def make_jpeg(width: int = 1024, height: int = 768) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(0)
    gradient = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    pixels = gradient + rng.normal(0, 40, (height, width, 3)).astype(np.float32)
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90)
    return out.getvalue()


_MEAN = np.array([0.481, 0.458, 0.408], dtype=np.float32)[:, None, None]
_STD = np.array([0.269, 0.261, 0.276], dtype=np.float32)[:, None, None]


def preprocess(jpeg: bytes) -> Any:
    """Decode, resize to 224x224, scale and normalise to a CHW float32 array."""
    from PIL import Image

    image = Image.open(io.BytesIO(jpeg)).convert("RGB").resize((224, 224), Image.BICUBIC)
    array = np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / 255.0
    return (array - _MEAN) / _STD


def noop() -> None:
    return None


def identity(x: Any) -> Any:
    return x


# ---- runners ------------------------------------------------------------------------

Runner = Callable[..., Awaitable[Any]]


async def measure(run: Runner, fn: Callable[..., Any], arg: Any, concurrency: int, calls: int) -> dict[str, float]:
    """`calls` calls, `concurrency` at a time, under a loop-lag monitor."""
    remaining = calls

    async def caller() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await run(fn, arg)

    async with offload.LoopLagMonitor(interval=0.001) as lag:
        start = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return {
        "calls_per_s": calls / elapsed,
        "lag_p50_ms": lag.p50 * 1e3,
        "lag_p99_ms": lag.p99 * 1e3,
    }


def runners(pools: dict[str, Any]) -> dict[str, Runner]:
    loop = asyncio.get_running_loop()

    async def inline(fn: Callable[..., Any], arg: Any) -> Any:
        return fn(arg)

    def stdlib(fn: Callable[..., Any], arg: Any) -> Awaitable[Any]:
        return loop.run_in_executor(pools["stdlib"], fn, arg)

    return {
        "inline": inline,
        "thread": pools["thread"].run,
        "process": pools["process"].run,
        "stdlib ProcessPool": stdlib,
    }


async def warm(pools: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    for _ in range(2):
        await asyncio.gather(
            *(pools["process"].run(time.sleep, 0.05) for _ in range(WORKERS)),
            *(loop.run_in_executor(pools["stdlib"], time.sleep, 0.05) for _ in range(WORKERS)),
        )


async def per_call_overhead(pools: dict[str, Any], calls: int) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    stdlib = pools["stdlib"]
    results: dict[str, list[float]] = {"process": [], "stdlib ProcessPool": []}
    # Interleaved rounds, so drift in the shared machine's load hits both alike.
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            await pools["process"].run(noop)
        results["process"].append((time.perf_counter() - start) / calls)
        start = time.perf_counter()
        for _ in range(calls):
            await loop.run_in_executor(stdlib, noop)
        results["stdlib ProcessPool"].append((time.perf_counter() - start) / calls)
    return {name: statistics.median(times) * 1e6 for name, times in results.items()}


async def transfer(sizes: list[int], repeats: int) -> dict[str, dict[str, float]]:
    """Median round trip (there and back) of a float64 array, in ms."""
    with_shm = offload.get_executor("process", max_workers=1, shared_memory_threshold=1)
    pipe_only = offload.get_executor("process", max_workers=1, shared_memory_threshold=None)
    out: dict[str, dict[str, float]] = {}
    try:
        for ex in (with_shm, pipe_only):
            await ex.run(noop)
        bar = progress.Progress(len(sizes), "process message sizes")
        for size in sizes:
            array = np.ones(size // 8)
            row: dict[str, float] = {}
            for label, ex in (("shared memory", with_shm), ("pipe", pipe_only)):
                times = []
                for _ in range(repeats if size < (8 << 20) else max(3, repeats // 4)):
                    start = time.perf_counter()
                    back = await ex.run(identity, array)
                    times.append(time.perf_counter() - start)
                    assert back.shape == array.shape
                    del back
                row[label] = statistics.median(times) * 1e3
            out[_size_name(size)] = row
            bar.step(_size_name(size))
        bar.close()
    finally:
        with_shm.shutdown()
        pipe_only.shutdown()
    return out


def _size_name(size: int) -> str:
    if size >= 1 << 20:
        return f"{size >> 20} MiB"
    return f"{size >> 10} KiB"


# ---- the run --------------------------------------------------------------------------


async def bench(smoke: bool) -> dict[str, Any]:
    n = 20_000 if smoke else 300_000  # about 2 / 30 ms of pure Python here
    jpeg = make_jpeg()
    workloads: dict[str, tuple[Callable[..., Any], Any, int]] = {
        "GIL-bound pure Python": (gil_work, n, 8 if smoke else 48),
        "JPEG decode+resize+normalise": (preprocess, jpeg, 8 if smoke else 64),
    }
    concurrency = (1, 8) if smoke else CONCURRENCY
    ctx = multiprocessing.get_context("forkserver")
    pools = {
        "thread": offload.get_executor("thread", max_workers=WORKERS),
        "process": offload.get_executor("process", max_workers=WORKERS, start_method="forkserver"),
        "stdlib": concurrent.futures.ProcessPoolExecutor(WORKERS, mp_context=ctx),
    }
    try:
        await warm(pools)
        table: dict[str, Any] = {}
        for workload, (fn, arg, calls) in workloads.items():
            fn(arg)  # warm imports in this process too (inline)
            table[workload] = {}
            for c in concurrency:
                for name, run in runners(pools).items():
                    table[workload].setdefault(name, {})[str(c)] = await measure(
                        run, fn, arg, c, max(calls, c)
                    )
        overhead = await per_call_overhead(pools, 50 if smoke else 1000)
    finally:
        pools["thread"].shutdown()
        pools["process"].shutdown()
        pools["stdlib"].shutdown()
    sizes = [1 << 10, 1 << 20, 32 << 20] if smoke else [1 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 32 << 20]
    payload = await transfer(sizes, 4 if smoke else 20)
    return {
        "smoke": smoke,
        "machine": {**_common.machine(), "load_avg_at_end": os.getloadavg()},
        "workers": WORKERS,
        "throughput_and_lag": table,
        "noop_overhead_us": overhead,
        "transfer_round_trip_ms": payload,
        "targets": targets(table, overhead, payload, concurrency),
    }


def targets(table: dict[str, Any], overhead: dict[str, float], payload: dict[str, Any], concurrency: tuple[int, ...]) -> list[dict[str, Any]]:
    gil = table["GIL-bound pure Python"]
    c = "8" if "8" in gil["process"] else str(concurrency[-1])
    lag_ratio = gil["process"][c]["lag_p99_ms"] / max(gil["thread"][c]["lag_p99_ms"], 1e-9)
    speedup = gil["process"][c]["calls_per_s"] / gil["thread"][c]["calls_per_s"]
    noop_ratio = overhead["process"] / overhead["stdlib ProcessPool"]
    big = payload["32 MiB"]
    shm_speedup = big["pipe"] / big["shared memory"]
    return [
        {"target": f"GIL-bound, concurrency {c}: process lag p99 <= 1/5 of thread's", "value": lag_ratio, "limit": 0.2, "met": lag_ratio <= 0.2},
        {"target": f"GIL-bound, concurrency {c}: process calls/s >= 1.3x thread's", "value": speedup, "limit": 1.3, "met": speedup >= 1.3},
        {"target": "no-op overhead <= 1.0x stdlib ProcessPoolExecutor", "value": noop_ratio, "limit": 1.0, "met": noop_ratio <= 1.0},
        {"target": "32 MiB round trip: shared memory >= 3x faster than the pipe", "value": shm_speedup, "limit": 3.0, "met": shm_speedup >= 3.0},
    ]


def markdown(result: dict[str, Any]) -> str:
    lines = ["# `process` strategy benchmark", ""]
    m = result["machine"]
    load = ", ".join(f"{x:.2f}" for x in m["load_avg_at_end"])
    smoke = " (smoke mode: tiny, not meaningful)" if result["smoke"] else ""
    lines += [
        (
            f"Measured {m['date']} at commit `{m['commit']}`, Python {m['python']} on {m['platform']}, {m['cpus']} CPUs, {result['workers']} "
            f"workers per pool, forkserver; one run{smoke}. The machine was shared with other "
            f"jobs (load average at the end: {load}), so figures are noisy."
        ),
        "",
        _common.start("table"),
        "## Targets",
        "",
        "| target | measured | met |",
        "|---|---|---|",
    ]
    for t in result["targets"]:
        lines.append(f"| {t['target']} | {t['value']:.2f} | {'yes' if t['met'] else '**no**'} |")
    for workload, strategies in result["throughput_and_lag"].items():
        concurrency = list(next(iter(strategies.values())))
        lines += ["", f"## {workload}: calls/s, loop lag p50 / p99 (ms)", ""]
        lines.append("| strategy | " + " | ".join(f"c={c}" for c in concurrency) + " |")
        lines.append("|---|" + "---|" * len(concurrency))
        for name, by_c in strategies.items():
            cells = [
                f"{r['calls_per_s']:.1f}/s, {r['lag_p50_ms']:.2f} / {r['lag_p99_ms']:.2f}"
                for r in (by_c[c] for c in concurrency)
            ]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    o = result["noop_overhead_us"]
    lines += [
        "",
        "## No-op round trip (sequential, median of 5 rounds)",
        "",
        "| pool | µs per call |",
        "|---|---|",
        *(f"| {name} | {us:.0f} |" for name, us in o.items()),
        "",
        "## Array round trip (there and back), median ms",
        "",
        "| size | shared memory | pipe only | pipe / shared memory |",
        "|---|---|---|---|",
    ]
    for size, row in result["transfer_round_trip_ms"].items():
        lines.append(
            f"| {size} | {row['shared memory']:.2f} | {row['pipe']:.2f} | {row['pipe'] / row['shared memory']:.2f}x |"
        )
    lines.append(_common.end("table"))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = _common.parser("Benchmark of the process strategy", "process").parse_args(argv)
    result = asyncio.run(bench(args.smoke))
    text = markdown(result)
    _common.write(args.out, "process", result, text)
    print(f"wrote the results into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
