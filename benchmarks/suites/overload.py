"""Overload benchmark: a vLLM pooling server at 128 clients, with and without a queue bound.

Two servers (same strategy and workers; one with `OFFLOAD_VLLM_MAX_QUEUE`) run
side by side; levels alternate between them (A B, B A, ...) so that the
machine's drift falls on both rows alike. For each level: accepted-request
latency (200s only), 503s, requests/s, and `/health` latency probed from
another process (`benchmarks.harness.load.HealthProber`).

A client refused with 503 waits the `Retry-After` it got, as one that honours
the header does, then sends its next request.

    python -m benchmarks overload                 # 5 pairs x 15 s, tiny model
    python -m benchmarks overload --smoke --out DIR

Writes overload.json and overload.md into --out (default
.benchmarks/runs/overload/).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks.harness import common as _common
from benchmarks.harness import load, mixed, models, progress, stats, workloads
from benchmarks.harness.server import ServerConfig, running_servers

# Starting two real servers is most of the smoke run; the smoke test allows this much.
SMOKE_TIMEOUT_S = 900

CLIENTS = 128
STRATEGY = "thread"
WORKERS = 2
#: 2 workers + 30: at most 32 requests in flight in the server (a quarter of the
#: 128 clients), enough for the engine to batch, few enough not to queue long.
MAX_QUEUE = 30


def run_level(url: str, clients: int, bodies: list[bytes], seconds: float) -> dict[str, Any]:
    """One level of `clients` closed-loop clients on the endpoint `url`, `/health`
    probed from another process; a request never answered counts as status 0."""
    with load.HealthProber(url) as prober:
        start = time.monotonic()
        tally = mixed.run_for(url, bodies, clients, seconds)
        window = (start, time.monotonic())
    ok = tally.summary(window)
    return {
        "statuses": {**ok["statuses"], **({"0": ok["lost"]} if ok["lost"] else {})},
        "accepted_per_s": ok["requests_per_s"], "accepted_p50_ms": ok["p50_ms"], "accepted_p99_ms": ok["p99_ms"],
        "duration_s": window[1] - window[0], "health": prober.summary(),
    }


def _median(values: list[float], digits: int = 2) -> str:
    return stats.fmt(stats.median_interval(values), digits) if values else "–"


def markdown(result: dict[str, Any]) -> str:
    rows = result["rows"]
    lines = [
        _common.start("meta"),
        (f"`python -m benchmarks overload {' '.join(result['argv'])}` on {result['machine']}, "
        f"{result['started']}: model {result['model']}, strategy `{STRATEGY}` with {WORKERS} workers, "
        f"{result['clients']} closed-loop clients, {result['pairs']} interleaved pairs of {result['seconds']:.0f} s levels; "
        "a refused client waits its `Retry-After`."),
        _common.end("meta"),
        "",
        _common.start("tables"),
        "| row | accepted/s | accepted p50 ms | accepted p99 ms | 503s | /health p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    for name, levels in rows.items():
        lines.append(
            f"| {name} | {_median([x['accepted_per_s'] for x in levels], 1)} "
            f"| {_median([x['accepted_p50_ms'] for x in levels], 0)} "
            f"| {_median([x['accepted_p99_ms'] for x in levels], 0)} "
            f"| {sum(x['statuses'].get('503', 0) for x in levels)} "
            f"| {_median([x['health']['p99_ms'] for x in levels], 1)} |"
        )
    ratios = result["ratios"]
    lines += [
        "",
        (f"Per pair, bounded / unbounded (median [interval] of {result['pairs']}): accepted p99 "
         f"{_median(ratios['accepted_p99'])}; /health p99 {_median(ratios['health_p99'])}."),
    ]
    lines += [_common.end("tables"), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = _common.parser(__doc__ or "", "overload", smoke="one pair of 1.5 s levels at 16 clients")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--clients", type=int, default=CLIENTS, help="closed-loop clients (not with --smoke)")
    args = p.parse_args(argv)
    clients = 16 if args.smoke else args.clients
    pairs, seconds = (1, 1.5) if args.smoke else (args.pairs, args.seconds)
    bound_name = f"max_queue={MAX_QUEUE}"
    configs = {
        "unbounded": ServerConfig("unbounded", STRATEGY, env={"OFFLOAD_VLLM_WORKERS": str(WORKERS)}),
        bound_name: ServerConfig(
            bound_name, STRATEGY,
            env={"OFFLOAD_VLLM_WORKERS": str(WORKERS), "OFFLOAD_VLLM_MAX_QUEUE": str(MAX_QUEUE)},
        ),
    }
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        model = models.build_tiny_embedding_model(Path(tmp) / models.EMBED_NAME)
        urls = {
            name: url + "/v1/embeddings"
            for name, (url, _) in stack.enter_context(
                running_servers(
                    {name: config.for_smoke() if args.smoke else config for name, config in configs.items()},
                    model,
                    {name: args.out / "logs" / f"overload-{name}.log" for name in configs},
                )
            ).items()
        }
        bodies = workloads.one_text_bodies(str(model), count=256, words=160)
        for url in urls.values():  # warm-up, not measured: first requests allocate
            mixed.run_for(url, bodies, 4, 0.5 if args.smoke else 2.0)
        rows: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
        names = list(configs)
        with progress.Progress(pairs * len(names), "overload levels") as bar:
            for pair in range(pairs):
                order = names if pair % 2 == 0 else names[::-1]
                for name in order:
                    level = run_level(urls[name], clients, bodies, seconds)
                    rows[name].append(level)
                    bar.step(f"pair {pair + 1} {name}")
                    bar.note(f"pair {pair + 1} {name}: {json.dumps(level)}")
    bounded, unbounded = rows[names[1]], rows[names[0]]
    ratios = {
        "accepted_p99": [b["accepted_p99_ms"] / u["accepted_p99_ms"] for b, u in zip(bounded, unbounded, strict=True) if u["accepted_p99_ms"]],
        "health_p99": [b["health"]["p99_ms"] / u["health"]["p99_ms"] for b, u in zip(bounded, unbounded, strict=True) if u["health"]["p99_ms"]],
    }
    result = {
        "argv": argv, "machine": _common.machine_words(), "started": started,
        "model": "tiny BERT embedding (random weights, built locally)", "pairs": pairs, "seconds": seconds,
        "clients": clients, "rows": rows, "ratios": ratios,
    }
    _common.write(args.out, "overload", result, markdown(result))
    print(f"wrote the results into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
