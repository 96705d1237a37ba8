"""`ray` against `process` on one node, and against Ray's own actor calls.

Needs `offload-ray` (`make test-ray` installs it into `.venv-ray`):

    PYTHONPATH=.venv-ray .venv/bin/python -m benchmarks ray
    PYTHONPATH=.venv-ray .venv/bin/python -m benchmarks ray --smoke

Two parts, each run in rounds; a round runs every row once, in turn, so slow
spells of a shared machine fall on all rows alike:

- **Per-call overhead**: sequential calls on one worker, a no-op and one
  MiniLM tokenizer call (the tokenizer built once per worker). Rows: `process`,
  `ray` (offload-ray) and bare Ray (`ray.get(actor.method.remote(...))` on an
  actor holding the same tokenizer: Ray's own actor-call latency). The ratio
  ray / bare Ray is taken per round, paired.
- **Image preprocessing** (base64 JPEG to CLIP pixel values, as
  `library.preprocess_image`) with 32 concurrent callers on 2 workers: images/s and the
  event loop's lag, `process` vs `ray`.

Each figure is the median over rounds with the range over rounds; with 5
rounds the range is a 94% interval for the median (the chance that the median
lies outside the smallest and largest of 5 values is 2/32).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from typing import Any

# Every Ray address on loopback (Ray reads this at import).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import offload
from benchmarks.harness import common as _common
from benchmarks.harness import library, progress, stats
from benchmarks.harness.workloads import jpeg_base64
from benchmarks.suites.overhead import load_tokenizer

SENTENCE = "The quick brown fox jumps over the lazy dog, again and again, until the tokenizer is warm."


def noop() -> None:
    return None


def tokenize(text: str) -> list[int]:
    return list(offload.worker_state().encode(text).ids)


BARE = "bare Ray actor, from a thread"
DIRECT = "bare Ray actor, blocking ray.get"


class BareActor:
    """The same work as a plain Ray actor: what the plugin is measured against."""

    def __init__(self) -> None:
        self.tokenizer = load_tokenizer()

    def noop(self) -> None:
        return None

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text).ids)


def _fmt(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    return stats.fmt(stats.median_interval([v * scale for v in values]), digits)


async def _time_calls(call: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        await call()
    return (time.perf_counter() - start) / calls


def overhead(rounds: int, calls: int) -> dict[str, dict[str, list[float]]]:
    import ray

    process = offload.get_executor("process", max_workers=1, initializer=load_tokenizer)
    ray_ex = offload.get_executor("ray", max_workers=1, initializer=load_tokenizer)
    actor = ray.remote(BareActor).options(num_cpus=1).remote()
    ray.get(actor.noop.remote())

    async def bare(method: str, *args: Any) -> Any:
        # From a thread, as the plugin does, so both pay the same hop.
        return await asyncio.to_thread(ray.get, getattr(actor, method).remote(*args))

    async def direct(method: str, *args: Any) -> Any:
        # Ray's own latency with no hop at all (it blocks the loop: one caller only).
        return ray.get(getattr(actor, method).remote(*args))

    rows: dict[str, dict[str, Callable[[], Any]]] = {
        "no-op": {
            "process": lambda: process.run(noop),
            "ray": lambda: ray_ex.run(noop),
            BARE: lambda: bare("noop"),
            DIRECT: lambda: direct("noop"),
        },
        "tokenize": {
            "process": lambda: process.run(tokenize, SENTENCE),
            "ray": lambda: ray_ex.run(tokenize, SENTENCE),
            BARE: lambda: bare("tokenize", SENTENCE),
            DIRECT: lambda: direct("tokenize", SENTENCE),
        },
    }
    results: dict[str, dict[str, list[float]]] = {w: {r: [] for r in rs} for w, rs in rows.items()}

    async def measure() -> None:
        for contenders in rows.values():  # warm every worker first
            for call in contenders.values():
                await _time_calls(call, 3)
        with progress.Progress(rounds, "ray per-call rounds") as bar:
            for _ in range(rounds):
                for workload, contenders in rows.items():
                    for row, call in contenders.items():
                        results[workload][row].append(await _time_calls(call, calls))
                bar.step()

    try:
        asyncio.run(measure())
    finally:
        process.shutdown()
        ray_ex.shutdown()
        ray.kill(actor)
    return results


async def _serve_images(executor: Any, pictures: list[str], clients: int, per_client: int,
                        workers: int) -> dict[str, float]:
    """Every worker warmed, then `clients` concurrent callers of `per_client` images each."""
    await asyncio.gather(*(executor.run(library.preprocess_image, pictures[0]) for _ in range(workers)))

    async def client(cid: int) -> None:
        for i in range(per_client):
            await executor.run(library.preprocess_image, pictures[(cid + i) % len(pictures)])

    async with offload.LoopLagMonitor(interval=0.001) as lag:
        start = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(clients)))
        wall = time.perf_counter() - start
    return {"images_per_s": clients * per_client / wall, "lag_p99_ms": lag.p99 * 1e3}


def images(
    rounds: int, clients: int, per_client: int, size: int, workers: int
) -> dict[str, dict[str, list[float]]]:
    pictures = [jpeg_base64(size, seed) for seed in range(8)]
    executors = {
        name: offload.get_executor(name, max_workers=workers)
        for name in ("process", "ray")
    }
    results: dict[str, dict[str, list[float]]] = {
        name: {"images_per_s": [], "lag_p99_ms": []} for name in executors
    }
    try:
        with progress.Progress(rounds, "ray image rounds") as bar:
            for _ in range(rounds):
                for name, executor in executors.items():
                    row = asyncio.run(_serve_images(executor, pictures, clients, per_client, workers))
                    results[name]["images_per_s"].append(row["images_per_s"])
                    results[name]["lag_p99_ms"].append(row["lag_p99_ms"])
                bar.step()
    finally:
        for executor in executors.values():
            executor.shutdown()
    return results


def main(argv: list[str] | None = None) -> int:
    import ray

    p = _common.parser(__doc__ or "", "ray")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    rounds, calls = (1, 5) if args.smoke else (args.rounds, 300)
    # Smoke: one worker per row (each worker is a process or an actor to start; one runs the same code).
    clients, per_client, size, workers = (2, 1, 64, 1) if args.smoke else (32, 4, 512, 2)
    started_here = not ray.is_initialized()
    if started_here:
        # "local": its own instance; without an address Ray would join the
        # cluster started last on this machine, with its load and its CPUs.
        ray.init(address="local", num_cpus=4, object_store_memory=100 << 20, include_dashboard=False,
                 configure_logging=False)
    try:
        per_call = overhead(rounds, calls)
        image_rows = images(rounds, clients, per_client, size, workers)
    finally:
        if started_here:
            ray.shutdown()
    meta = {**_common.machine(), "mode": "smoke" if args.smoke else "full", "rounds": rounds,
            "calls_per_round": calls, "clients": clients, "images_per_client": per_client,
            "image_px": size, "image_workers": workers, "load_average": os.getloadavg()}
    ratios = {
        f"{workload}, ray / {baseline}": [r / b for r, b in zip(rows["ray"], rows[baseline], strict=True)]
        for workload, rows in per_call.items()
        for baseline in (BARE, DIRECT)
    }
    lag_ratio = [
        r / p for r, p in zip(image_rows["ray"]["lag_p99_ms"], image_rows["process"]["lag_p99_ms"], strict=True)
    ]
    body = [
        [workload, row, _fmt(values, 1e6)]
        for workload, rows in per_call.items()
        for row, values in rows.items()
    ]
    text = _common.table(["workload", "row", "µs per call, median [range]"], body)
    text += "\n" + _common.table(
        ["ratio", "median [range] (paired per round)"],
        [[w, _fmt(v, digits=2)] for w, v in ratios.items()],
    )
    text += "\n" + _common.table(
        ["strategy", "images/s, median [range]", "loop lag p99 ms, median [range]"],
        [[n, _fmt(r["images_per_s"]), _fmt(r["lag_p99_ms"], digits=2)] for n, r in image_rows.items()],
    )
    text += f"\nLoop lag p99, ray / process (paired per round): {_fmt(lag_ratio, digits=2)}.\n"
    setup = (
        f"{rounds} rounds, rows interleaved; overhead: {calls} sequential calls per row per round on "
        f"one worker; images: {clients} callers x {per_client} {size} px JPEGs per round on {workers} workers; "
        f"load average at the end {meta['load_average'][0]:.1f}; commit `{meta['commit']}`, {meta['date']}.\n\n"
    )
    markdown = f"{_common.start('tables')}\n{setup}{text}{_common.end('tables')}\n"
    _common.write(
        args.out, "ray",
        {"meta": meta, "per_call_s": per_call, "ray_over_bare": ratios, "images": image_rows,
         "lag_p99_ray_over_process": lag_ratio},
        _common.header("ray vs process on one node", meta) + markdown,
    )
    print(f"wrote the results into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
