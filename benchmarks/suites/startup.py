"""Start-up and memory of a new user's server, per strategy: how long from
start to the first answers, and what the strategy's workers hold.

Each row is a server as a new user starts it (`vLLM default`, or the
adapter's launcher with `--offload-strategy S` and nothing else: as many
workers as the strategy picks). Each round starts every row's server alone,
in a fresh random order, and for each:

1. *ready*: seconds from starting the process to the first 200 of `/health`
   (asked every `POLL_S`), the port being opened after offload's workers started;
2. *first requests*: the latency of the first small `/v1/embeddings` request
   (one 8-word input), then of the first heavy one (16 inputs of 1500 words
   kept to 32 tokens, the mixed suite's truncated flood): a worker that sets
   itself up on its first call pays it here;
3. *memory*, idle after those requests: PSS and RSS of the API server process
   (the event loop and any worker threads), of offload's worker processes
   (together, and how many), and of the rest (vLLM's engine), and the API
   server's thread count (`benchmarks/harness/procstat.py`).

Then the server is stopped. Medians over rounds with distribution-free
intervals, and per-round paired figures: each row's start-up against `vLLM
default`'s, and `process defaults` against `thread defaults`.

    python -m benchmarks startup                 # 3 rows, 3 rounds
    python -m benchmarks startup --rounds 5
    python -m benchmarks startup --smoke --out DIR

Writes startup.{json,md} into --out (default .benchmarks/runs/startup).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.harness import common as _common
from benchmarks.harness import models, procstat, progress, stats, workloads
from benchmarks.harness.server import ServerConfig, running_servers

#: Starting the smoke run's one server is most of it.
SMOKE_TIMEOUT_S = 600

DEFAULT = "vLLM default"
#: Each server reserves this share of RAM for its KV cache (as the mixed suite's).
MEMORY = ("--gpu-memory-utilization", "0.04")
ROWS: dict[str, ServerConfig] = {
    DEFAULT: ServerConfig(DEFAULT, extra_args=MEMORY),
    "thread defaults": ServerConfig("thread defaults", "thread", MEMORY),
    "process defaults": ServerConfig("process defaults", "process", MEMORY),
}
#: The rows whose per-round difference the report gives (row, baseline).
PAIRS = (("thread defaults", DEFAULT), ("process defaults", DEFAULT), ("process defaults", "thread defaults"))
#: 3 rounds: a start takes about a minute here; the interval is then [min, max].
ROUNDS = 3
#: How often `/health` is asked while a server starts: the ready time's resolution.
POLL_S = 0.1
#: A first request's bound; a start-up that needs longer is a failure to report.
REQUEST_TIMEOUT_S = 120.0

#: metric -> (label, unit, digits)
METRICS: dict[str, tuple[str, str, int]] = {
    "ready_s": ("start to /health 200", "s", 1),
    "first_small_ms": ("first small request", "ms", 0),
    "first_heavy_ms": ("first heavy request", "ms", 0),
    "pss_api": ("API server PSS", "MiB", 0),
    "pss_workers": ("worker processes PSS (together)", "MiB", 0),
    "pss_engine": ("engine PSS", "MiB", 0),
    "rss_api": ("API server RSS", "MiB", 0),
    "rss_workers": ("worker processes RSS (together)", "MiB", 0),
    "worker_processes": ("worker processes", "", 0),
    "api_threads": ("API server threads", "", 0),
}


def _post_ms(url: str, body: bytes) -> float:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as answer:
        answer.read()
        if answer.status != 200:
            raise RuntimeError(f"{url}: HTTP {answer.status}")
    return 1e3 * (time.perf_counter() - start)


def _api_threads(pid: int) -> float:
    return float(len(os.listdir(f"/proc/{pid}/task")))


def measure(config: ServerConfig, model: Path, small: bytes, heavy: bytes, log: Path) -> dict[str, float]:
    """One start of `config`'s server, alone: its figures (`METRICS`)."""
    started = time.monotonic()
    with running_servers({config.name: config}, model, {config.name: log}, poll_s=POLL_S) as servers:
        ready_s = time.monotonic() - started
        url, pid = servers[config.name]
        block = {
            "ready_s": ready_s,
            "first_small_ms": _post_ms(url + "/v1/embeddings", small),
            "first_heavy_ms": _post_ms(url + "/v1/embeddings", heavy),
        }
        pss = procstat.memory_mib(pid)
        rss = procstat.memory_mib(pid, kind="rss")
        block.update({f"pss_{part}": pss.get(part, 0.0) for part in ("api", "workers", "engine")})
        block.update({f"rss_{part}": rss.get(part, 0.0) for part in ("api", "workers")})
        block.update(worker_processes=pss.get("worker_processes", 0.0), api_threads=_api_threads(pid))
    return block


def summarize(blocks: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    values = {
        row: {metric: stats.median_interval([b[metric] for b in row_blocks]).__dict__ for metric in METRICS}
        for row, row_blocks in blocks.items() if row_blocks
    }
    pairs = []
    for row, base in PAIRS:
        if blocks.get(row) and blocks.get(base):
            ready = [b["ready_s"] for b in blocks[row]], [b["ready_s"] for b in blocks[base]]
            memory = [sum(b[f"pss_{p}"] for p in ("api", "workers")) for b in blocks[row]], \
                [sum(b[f"pss_{p}"] for p in ("api", "workers")) for b in blocks[base]]
            pairs.append({
                "row": row, "baseline": base,
                "ready_s_diff": stats.median_interval([a - b for a, b in zip(*ready, strict=True)]).__dict__,
                "ready_ratio": stats.median_interval(stats.paired_ratios(*ready)).__dict__,
                "pss_api_workers_diff": stats.median_interval(
                    [a - b for a, b in zip(*memory, strict=True)]).__dict__,
            })
    return {"values": values, "pairs": pairs}


_fmt = stats.fmt


def markdown(result: dict[str, Any]) -> str:
    summary = result["summary"]
    coverage = stats.median_interval([0.0] * result["rounds"]).coverage
    lines = [
        "# Start-up and memory, per strategy",
        "",
        _common.start("meta"),
        _common.run_line(result),
        "",
        (f"Tiny BERT embeddings. Each round started every row's server alone, rows in a fresh random order; "
         f"ready: start to the first 200 of `/health` (asked every {POLL_S:g} s); then one small request (one "
         "8-word input) and one heavy (16 inputs of 1500 words kept to 32 tokens), each timed; then memory, "
         f"idle. {result['rounds']} rounds; medians over rounds, [intervals] from order statistics (coverage "
         f"{100 * coverage:.1f}%). Run took {result['wall_s']:.0f} s."),
        _common.end("meta"),
        "",
        _common.start("tables"),
        "| row | " + " | ".join(f"{label} ({unit})" if unit else label for label, unit, _ in METRICS.values()) + " |",
        "|---|" + "---|" * len(METRICS),
    ]
    for row, values in summary["values"].items():
        lines.append(f"| {row} | " + " | ".join(
            _fmt(values[metric], digits) for metric, (_, _, digits) in METRICS.items()) + " |")
    if summary["pairs"]:
        lines += [
            "",
            ("Paired per round: start-up, row less baseline (s) and row / baseline; API server and worker "
             "processes' PSS together, row less baseline (MiB):"),
            "",
            "| row | baseline | start-up difference (s) | start-up ratio | API + workers PSS difference (MiB) |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {p['row']} | {p['baseline']} | {_fmt(p['ready_s_diff'], 1)} | {_fmt(p['ready_ratio'], 2)}x | "
            f"{_fmt(p['pss_api_workers_diff'], 0)} |"
            for p in summary["pairs"]
        ]
    lines += ["", "Servers (model path and port vary):", ""]
    lines += [f"- {row}: `{command}`" for row, command in result["servers"].items()]
    lines += [_common.end("tables"), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = _common.parser(__doc__ or "", "startup", smoke="the `thread defaults` row, one round, without torch.compile")
    p.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    p.add_argument("--rounds", type=int, default=ROUNDS)
    p.add_argument("--seed", type=int, default=0, help="the rows' order")
    args = p.parse_args(argv)
    rows, rounds = (["thread defaults"], 1) if args.smoke else (args.rows, args.rounds)
    configs = {row: ROWS[row].for_smoke() if args.smoke else ROWS[row] for row in rows}
    began = time.monotonic()
    result: dict[str, Any] = {
        "argv": argv, "command": _common.command("startup", argv),
        "machine": _common.machine(), "dirty": _common.dirty(), "loadavg_before": _common.loadavg(), "rounds": rounds,
    }
    blocks: dict[str, list[dict[str, float]]] = {row: [] for row in rows}
    with tempfile.TemporaryDirectory() as tmp:
        model = models.build_tiny_embedding_model(Path(tmp) / models.EMBED_NAME)
        result["servers"] = {
            row: config.shown() for row, config in configs.items()
        }
        small = workloads.text_bodies(str(model), count=1, inputs=1, words=8)[0]
        heavy = workloads.text_bodies(str(model), count=1, inputs=16, words=1500, truncate=32, seed=1000)[0]
        for round_number, row, bar in progress.interleaved(rows, rounds, args.seed, "startup starts"):
            log = args.out / "logs" / f"startup-{row.replace(' ', '-')}-{round_number}.log"
            block = measure(configs[row], model, small, heavy, log)
            blocks[row].append(block)
            bar.note(f"round {round_number + 1} {row}: ready {block['ready_s']:.1f} s, first requests "
                     f"{block['first_small_ms']:.0f} / {block['first_heavy_ms']:.0f} ms, PSS API "
                     f"{block['pss_api']:.0f} + workers {block['pss_workers']:.0f} MiB ({block['worker_processes']:.0f})")
    result.update(loadavg_after=_common.loadavg(), wall_s=time.monotonic() - began, blocks=blocks,
                  summary=summarize(blocks))
    _common.write(args.out, "startup", result, markdown(result))
    print(markdown(result))
    print(f"wrote the results into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
