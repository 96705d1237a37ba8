"""Per-call overhead of handing a call off the event loop, one caller at a time.

Contenders, measured in the same run and interleaved round by round so that
machine noise hits them alike: offload `inline` and `thread`, bare
`loop.run_in_executor` on a same-size `ThreadPoolExecutor` (what vLLM's
`make_async` does), `asyncio.to_thread`, `anyio.to_thread.run_sync`.
Workloads: a no-op, and one MiniLM tokenizer call on a short sentence.

    python -m benchmarks overhead [--smoke] [--out DIR]
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio.to_thread

import offload
from benchmarks.harness import common as _common
from benchmarks.harness import progress, stats

WORKERS = 4  # the same pool size for every thread-based contender


def noop() -> None:
    return None


def load_tokenizer() -> Any:
    from tokenizers import Tokenizer

    from benchmarks.harness.models import minilm_dir

    return Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))


Runner = Callable[[Callable[[], Any]], Awaitable[Any]]


def contenders(pool: concurrent.futures.ThreadPoolExecutor) -> dict[str, tuple[Runner, Callable[[], None]]]:
    inline = offload.get_executor("inline")
    thread = offload.get_executor("thread", max_workers=WORKERS)

    async def bare(fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(pool, fn)

    return {
        "offload inline": (inline.run, inline.shutdown),
        "offload thread": (thread.run, thread.shutdown),
        "run_in_executor": (bare, lambda: None),
        "asyncio.to_thread": (asyncio.to_thread, lambda: None),
        "anyio.to_thread.run_sync": (anyio.to_thread.run_sync, lambda: None),
    }


async def time_calls(run: Runner, fn: Callable[[], Any], calls: int) -> float:
    """Mean seconds per sequential call."""
    start = time.perf_counter()
    for _ in range(calls):
        await run(fn)
    return (time.perf_counter() - start) / calls


async def measure(smoke: bool) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, list[float]]]]:
    tokenizer = load_tokenizer()
    sentence = "The quick brown fox jumps over the lazy dog near the riverbank at dawn."

    def tokenize() -> Any:
        return tokenizer.encode(sentence).ids

    workloads = {"no-op": noop, "tokenize": tokenize}
    rounds, calls = (2, 20) if smoke else (15, 400)
    results: dict[str, dict[str, float]] = {}
    #: workload -> contender -> each round's mean seconds per call (what `compare` reads).
    rounds_s: dict[str, dict[str, list[float]]] = {}
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        runners = contenders(pool)
        bar = progress.Progress(len(workloads) * rounds, "overhead rounds")
        try:
            for workload, fn in workloads.items():
                samples: dict[str, list[float]] = {name: [] for name in runners}
                for run, _ in runners.values():  # warm up threads and caches
                    await time_calls(run, fn, calls // 4 + 1)
                for number in range(rounds):
                    for name, (run, _) in runners.items():
                        samples[name].append(await time_calls(run, fn, calls))
                    bar.step(f"{workload}, round {number + 1}")
                rounds_s[workload] = samples
                results[workload] = {name: statistics.median(s) for name, s in samples.items()}
        finally:
            bar.close()
            for _, close in runners.values():
                close()
    return results, rounds_s


def report(rounds_s: dict[str, dict[str, list[float]]], info: dict[str, Any]) -> str:
    md = _common.header("Per-call overhead (one caller, asyncio)", info)
    md += ("Mean time per sequential call, median over rounds [interval]; ratio to bare `run_in_executor` "
           f"taken within each round, median [interval]. Load average at the end: {info['loadavg']}.\n\n")
    md += _common.start("table") + "\n"
    for workload, by_name in rounds_s.items():
        base = by_name["run_in_executor"]
        rows = []
        for name, seconds in by_name.items():
            rows.append([name, stats.fmt(stats.median_interval([s * 1e6 for s in seconds]), 1),
                         stats.fmt(stats.median_interval(stats.paired_ratios(seconds, base))) + "×"])
        md += f"## {workload}\n\n" + _common.table(["contender", "µs / call", "vs run_in_executor"], rows) + "\n"
    noop = rounds_s["no-op"]
    thread = stats.median_interval(stats.paired_ratios(noop["offload thread"], noop["run_in_executor"]))
    md += (
        f"Target: `thread` ≤ 1.05× bare `run_in_executor` on the no-op (stretch ≤ 0.8×): "
        f"measured {stats.fmt(thread)}× — "
        f"{stats.target_verdict(thread.low, thread.median, thread.high, 1.05)}"
        f"{', stretch met' if thread.high <= 0.8 else ''}.\n"
        f"{_common.end('table')}\n"
    )
    return md


def main(argv: list[str] | None = None) -> int:
    args = _common.parser(__doc__ or "", "overhead").parse_args(argv)
    results, rounds_s = asyncio.run(measure(args.smoke))
    info = {**_common.machine(), "loadavg": " / ".join(f"{x:.1f}" for x in os.getloadavg())}
    md = report(rounds_s, info)
    data = {"machine": info, "smoke": args.smoke, "seconds_per_call": results, "rounds_seconds_per_call": rounds_s}
    _common.write(args.out, "overhead", data, md)
    print(f"wrote {args.out / 'overhead'}.json and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
