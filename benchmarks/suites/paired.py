"""Paired, interleaved end-to-end benchmark: CPU per request of a vLLM pooling
server under each offload strategy, against vLLM's default, with intervals.

All rows' servers run side by side (tiny BERT, 160-word inputs); the load
visits them in short blocks, in a fresh random order every round, so that the
machine's drift and its neighbours' noise fall on every row alike. Only the
row being measured gets traffic. For every block and row:

- completed requests/s, latency p50/p99, `/health` p99 (probed from another process);
- CPU seconds from `/proc`, per completed request, of: the API server's
  event-loop thread, the whole API-server process, offload's worker processes,
  and the engine (engine core + model worker), and their total;
- the projected ceiling of one API server: 1 / (loop-thread CPU per request),
  requests/s one API server could take before its loop is saturated; unlike
  throughput on this 2-core machine, it carries to a host with free cores;
- the load generator's own CPU per request (this process: the closed-loop
  clients; request bodies are JSON encoded once, `workloads`).

Each strategy's figures are compared with vLLM's default *per round* (the
blocks of one round ran minutes apart at most); the report gives the median
ratio with a distribution-free 95% interval (order statistics) and a verdict.

    python -m benchmarks paired                 # make bench: 5 rows, 6 rounds, 8 s blocks
    python -m benchmarks paired --workload batch --rows process thread
    python -m benchmarks paired --smoke --out DIR

Workloads (`--workload`; `WORKLOADS` says what each sends to which model): `tiny`
(the CPU-per-request measurement's), `batch` (a request's several prompts),
`truncated` (what tokenizing only the kept part saves), and on models of their
own `rerank` and `multilingual`, where every row must answer as vLLM's default does.
Writes paired.json and paired.md (paired-<workload>.* for the others) into --out
(default .benchmarks/runs/paired/).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import common as _common
from benchmarks.harness import load, mixed, models, procstat, progress, stats, workloads
from benchmarks.harness.server import ServerConfig, running_servers

#: Starting the smoke run's two servers is most of it.
SMOKE_TIMEOUT_S = 900

DEFAULT = "vLLM default"
#: `--api-server-count 2`: two API server processes before one engine (vLLM's
#: answer for a frontend-bound server), each of offload's with one worker, so
#: that the two together have as many as this machine has cores.
TWO_API_SERVERS = ("--api-server-count", "2")
#: Rows that vary one thing: name -> (strategy or None for vLLM alone, server
#: environment, server arguments).
VARIANTS: dict[str, tuple[str | None, dict[str, str], tuple[str, ...]]] = {
    # What prefix tokenization adds (the truncated workload).
    "thread no prefix": ("thread", {"OFFLOAD_VLLM_WORKERS": "2", "OFFLOAD_VLLM_PREFIX_TOKENIZE": "0"}, ()),
    # Every call on a worker: what running calls priced at most the inline cost on the loop costs it.
    "thread inline 0": ("thread", {"OFFLOAD_VLLM_WORKERS": "2", "OFFLOAD_VLLM_INLINE_COST": "0"}, ()),
    # Scale-out: vLLM's and offload's, against one API server each.
    "vLLM api-server-count 2": (None, {}, TWO_API_SERVERS),
    "thread api-server-count 2": ("thread", {"OFFLOAD_VLLM_WORKERS": "1"}, TWO_API_SERVERS),
}
ROWS = (DEFAULT, "inline", "thread", "process", "async-renderer", *VARIANTS)
#: Hosts the report projects each row's requests/s to (`projection`).
PROJECTED_CORES = (8, 32)
#: Two workers where the strategy has a pool: as many as this machine has cores.
WORKERS = {"thread": "2", "process": "2"}
#: Each server reserves this share of RAM for its KV cache (five run at once).
MEMORY_FRACTION = "0.04"


@dataclass(frozen=True)
class Workload:
    """What a request sends, to which model and route (`--workload`)."""

    #: What the report says it sends.
    description: str
    #: The request bodies for the model's path, and whether it is a smoke run.
    bodies: Callable[[str, bool], list[bytes]]
    model: Callable[[Path], Path] = models.build_tiny_embedding_model
    model_dir: str = models.EMBED_NAME
    route: str = "/v1/embeddings"
    #: Whether every row must answer as vLLM's default does (`same_answers`).
    checks_answers: bool = False


_TINY_BERT = "tiny BERT embedding (random weights), "
WORKLOADS: dict[str, Workload] = {
    "tiny": Workload(_TINY_BERT + "160-word inputs, one per request",
                     lambda m, _: workloads.one_text_bodies(m, count=256, words=160)),
    "batch": Workload(_TINY_BERT + "32 inputs of 24 words per request",
                      lambda m, _: workloads.text_bodies(m, count=4, inputs=32, words=24)),
    "truncated": Workload(_TINY_BERT + "16 inputs of 1500 words per request, kept to 32 tokens",
                          lambda m, _: workloads.text_bodies(m, count=4, inputs=16, words=1500, truncate=32)),
    "rerank": Workload(
        ("`/rerank`, one query and 32 documents of 5,000 words per request, kept to 512 tokens "
         "(tiny BERT cross-encoder, random weights, MiniLM's WordPiece tokenizer)"),
        lambda m, smoke: workloads.rerank_bodies(m, count=4, documents=4 if smoke else 32,
                                                 words=600 if smoke else 5000, truncate=512),
        models.build_tiny_cross_encoder, models.CROSS_ENCODER_NAME, "/rerank", checks_answers=True,
    ),
    "multilingual": Workload(
        ("16 multilingual inputs of 1500 words per request, kept to 32 tokens (tiny XLM-R embedding model, "
         "random weights, a SentencePiece Unigram tokenizer trained here with `nmt_nfkc`)"),
        lambda m, smoke: workloads.multilingual_bodies(m, count=4, inputs=4 if smoke else 16,
                                                       words=300 if smoke else 1500, truncate=32),
        models.build_tiny_xlmr, models.XLMR_NAME, checks_answers=True,
    ),
}
PART_NAMES = {
    "loop": "loop thread",
    "loop_kernel": "of which in the kernel",
    "api": "API-server process",
    "workers": "offload workers",
    "engine": "engine + model worker",
    "engine_core": "of which engine core",
    "total": "total",
}


def config(row: str, smoke: bool = False) -> ServerConfig:
    """A row's server; in a smoke run as `ServerConfig.for_smoke` starts it, with one worker."""
    if smoke:
        smoked = config(row).for_smoke()
        return dataclasses.replace(smoked, env={**smoked.env, "OFFLOAD_VLLM_WORKERS": "1"}) if row in WORKERS else smoked
    args = ("--gpu-memory-utilization", MEMORY_FRACTION)
    if row == DEFAULT:
        # vLLM's default renderer pool (--renderer-num-workers 1), stated for the record.
        return ServerConfig(row, extra_args=(*args, "--renderer-num-workers", "1"))
    if row in VARIANTS:
        strategy, env, more = VARIANTS[row]
        return ServerConfig(row if strategy is None else f"offload {row}", strategy=strategy,
                            extra_args=(*args, *more), env=env)
    env = {"OFFLOAD_VLLM_WORKERS": WORKERS[row]} if row in WORKERS else {}
    return ServerConfig(f"offload {row}", strategy=row, extra_args=args, env=env)


def measure_block(url: str, pid: int, clients: int, bodies: list[bytes], seconds: float,
                  path: str = "/v1/embeddings") -> dict[str, Any]:
    """One block of `clients` closed-loop clients on the server at `url` (API server `pid`) for `seconds`."""
    before, client_before = procstat.snapshot(pid), sum(os.times()[:2])
    with load.HealthProber(url) as prober:
        start = time.monotonic()
        tally = mixed.run_for(url + path, bodies, clients, seconds)
        window = (start, time.monotonic())
    after, client = procstat.snapshot(pid), sum(os.times()[:2]) - client_before
    used = procstat.cpu_used(before, after)
    level = tally.summary(window)
    done = max(level["ok"], 1)
    return {
        "requests": level["ok"],
        "errors": level["sent"] - level["ok"],
        "first_error": level["first_error"],
        "requests_per_s": level["requests_per_s"],
        "p50_ms": level["p50_ms"],
        "p99_ms": level["p99_ms"],
        "health_p99_ms": prober.summary().get("p99_ms", 0.0),
        "cpu_ms_per_request": {part: 1e3 * seconds_used / done for part, seconds_used in used.items()},
        "api_servers": after.api_servers,
        "client_cpu_ms_per_request": 1e3 * client / done,
        "new_workers": procstat.new_workers(before, after),
    }


def _metric(block: dict[str, Any], name: str) -> float:
    if name.startswith("cpu:"):
        return float(block["cpu_ms_per_request"][name[4:]])
    if name == "client":
        return float(block["client_cpu_ms_per_request"])
    if name == "ceiling":
        loop_ms = block["cpu_ms_per_request"]["loop"]
        return 1e3 / loop_ms if loop_ms > 0 else 0.0
    return float(block[name])


def summarize(blocks: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    metrics = [
        "requests_per_s", "p99_ms", "health_p99_ms", "ceiling",
        *(f"cpu:{p}" for p in PART_NAMES),
    ]
    summary: dict[str, Any] = {}
    for row, row_blocks in blocks.items():
        summary[row] = {"values": {}, "ratio": {}}
        # A part older runs did not split out (the engine core) is left out, not made up.
        measured = [m for m in [*metrics, "client"]
                    if not m.startswith("cpu:") or all(m[4:] in b["cpu_ms_per_request"] for b in row_blocks)]
        for metric in measured:
            values = [_metric(b, metric) for b in row_blocks]
            summary[row]["values"][metric] = stats.median_interval(values).__dict__
            if row != DEFAULT and DEFAULT in blocks:
                base = [_metric(b, metric) for b in blocks[DEFAULT]]
                ratios = stats.paired_ratios(values, base)
                if ratios:
                    summary[row]["ratio"][metric] = stats.median_interval(ratios).__dict__
    return summary


_fmt = stats.fmt


def _ratio_cell(row: dict[str, Any], metric: str, *, higher: str, lower: str) -> str:
    ratio = row["ratio"].get(metric)
    if ratio is None:
        return "–"
    interval = stats.Interval(**ratio)
    return f"{_fmt(ratio)}x, {stats.verdict(interval, higher=higher, lower=lower)}"


def _check(summary: dict[str, Any], row: str, metric: str, bound: float, what: str, *,
           at_least: bool = False) -> list[str]:
    """A target on `row`'s per-round ratio to vLLM's default, read from this run (none where not run)."""
    ratio = summary.get(row, {}).get("ratio", {}).get(metric)
    if ratio is None:
        return []
    sign = ">=" if at_least else "<="
    return [f"- {what} {sign} {bound}x default: {_fmt(ratio)}x — {_verdict(ratio, bound, at_least=at_least)}"]


def _not_lower(ratio: dict[str, float], word: str) -> str:
    return f"**{word} beyond its interval (missed)**" if ratio["high"] < 1 else f"not {word} beyond its interval (met)"


def targets(summary: dict[str, Any]) -> list[str]:
    """The CPU-per-request targets, read from this run."""
    lines = [
        *_check(summary, "process", "cpu:loop", 0.6, "`process` loop-thread CPU/request"),
        *_check(summary, "process", "cpu:api", 0.7, "`process` whole-API-server CPU/request"),
        *_check(summary, "process", "cpu:total", 1.3, "`process` total CPU/request"),
        *_check(summary, "thread", "cpu:api", 1.0, "`thread` whole-API-server CPU/request"),
        *_check(summary, "process", "ceiling", 1.6, "`process` projected ceiling of one API server", at_least=True),
    ]
    for row in ROWS[2:]:
        ratio = summary.get(row, {}).get("ratio", {}).get("requests_per_s")
        if ratio is not None:
            lines.append(f"- `{row}` throughput vs default: {_fmt(ratio)}x — {_not_lower(ratio, 'slower')}")
    process = summary.get("process", {}).get("values", {}).get("health_p99_ms")
    if process is not None:
        lines.append(f"- `process` `/health` p99 <= 20 ms: {_fmt(process, 1)} ms — {_verdict(process, 20)}")
    return lines


def loop_targets(summary: dict[str, Any]) -> list[str]:
    """The loop-first targets for the batch workload: `/health` no worse than default's."""
    lines = []
    for row, bound in (("process", 0.5), ("thread", 1.0)):
        health = summary.get(row, {}).get("ratio", {}).get("health_p99_ms")
        rate = summary.get(row, {}).get("ratio", {}).get("requests_per_s")
        if health is not None and rate is not None:
            lines.append(f"- `{row}` `/health` p99 <= {bound}x default: {_fmt(health)}x — {_verdict(health, bound)}; "
                         f"requests/s {_fmt(rate)}x — {_not_lower(rate, 'lower')}")
    return lines


def scale_out_targets(blocks: dict[str, list[dict[str, Any]]]) -> list[str]:
    """offload's two API servers against vLLM's two, paired per round: requests/s at least theirs."""
    ours, theirs = blocks.get("thread api-server-count 2"), blocks.get("vLLM api-server-count 2")
    if not ours or not theirs:
        return []
    ratios = stats.paired_ratios([b["requests_per_s"] for b in ours], [b["requests_per_s"] for b in theirs])
    if not ratios:
        return []
    ratio = stats.median_interval(ratios).__dict__
    return [(f"- `thread api-server-count 2` requests/s vs `vLLM api-server-count 2` (per round): "
            f"{_fmt(ratio)}x — {_not_lower(ratio, 'lower')}")]


def projection(result: dict[str, Any]) -> list[str]:
    """Each row's requests/s on a host of `PROJECTED_CORES` cores, on paper,
    from this run's median CPU per request: the least of what its API servers'
    loops, its engine core and the host's cores can each carry."""
    summary, blocks = result["summary"], result["blocks"]
    rows = []
    for row, entry in summary.items():
        v = {name: value["median"] for name, value in entry["values"].items()}
        if not v.get("cpu:engine_core") or not v.get("cpu:loop"):
            continue  # a run from before the engine core was counted apart
        servers = max(b.get("api_servers", 1) for b in blocks[row])
        bounds = {"its loops": servers * 1e3 / v["cpu:loop"], "the engine core": 1e3 / v["cpu:engine_core"]}
        host_ms = v["cpu:api"] + v["cpu:workers"] + v["cpu:engine_core"]
        cells = []
        for cores in PROJECTED_CORES:
            limits = {**bounds, "the cores": cores * 1e3 / host_ms}
            least = min(limits, key=limits.__getitem__)
            cells.append(f"{limits[least]:.0f} ({least})")
        rows.append([row, str(servers), *cells])
    if not rows:
        return []
    return [
        ("Projected requests/s of one server on a larger host, on paper from the CPU per request above "
        "(medians). Assumed: each API server's loop thread carries at most one core, and so does the "
        "engine core (one process); the model's forward runs on an accelerator and costs the host's "
        "cores nothing (the model worker's CPU is left out); every other part costs what it cost here "
        "and spreads over the cores; nothing else runs on the host. A ceiling, not a measurement:"),
        "",
        _common.table(["row", "API servers", *(f"{c} cores: requests/s (bound by)" for c in PROJECTED_CORES)], rows),
    ]


def _verdict(interval: dict[str, float], bound: float, *, at_least: bool = False) -> str:
    return stats.target_verdict(interval["low"], interval["median"], interval["high"], bound, at_least=at_least)


def answers(url: str, path: str, payload: dict[str, Any]) -> tuple[list[Any], int]:
    """A server's answer to one request: its scores or embeddings, by index, and its prompt tokens."""
    import httpx

    r = httpx.post(url + path, json=payload, timeout=600)
    r.raise_for_status()
    data = r.json()
    items = data["results"] if "results" in data else data["data"]
    values = [item.get("relevance_score", item.get("score", item.get("embedding"))) for item in items]
    order = sorted(range(len(items)), key=lambda k: items[k]["index"])
    return [values[k] for k in order], int(data["usage"]["prompt_tokens"])


def same_answers(servers: dict[str, tuple[str, int]], path: str, bodies: list[bytes]) -> dict[str, bool]:
    """Whether each row answers two requests as vLLM's default does: the same
    prompt tokens, and scores or embeddings within 1e-5."""
    import numpy as np

    same = {}
    for row, (url, _) in servers.items():
        same[row] = True
        for body in bodies[:2]:
            payload = json.loads(body)
            ours, our_tokens = answers(url, path, payload)
            theirs, their_tokens = answers(servers[DEFAULT][0], path, payload)
            same[row] &= our_tokens == their_tokens and bool(np.allclose(ours, theirs, atol=1e-5, rtol=0))
    return same


def _targets(result: dict[str, Any]) -> list[str]:
    workload = result.get("workload", "tiny")
    if workload == "tiny":
        return [*targets(result["summary"]), *scale_out_targets(result["blocks"])]
    if workload == "truncated" or WORKLOADS[workload].checks_answers:
        # `thread` (prefix tokenization on) serves at least 4x the requests/s of vLLM's default.
        lines = _check(result["summary"], "thread", "requests_per_s", 4, "`thread` requests/s", at_least=True)
        same = result.get("same_answers")
        if same is not None:
            lines.append(
                f"- every row answers exactly as vLLM's default (scores or embeddings within 1e-5, same `usage`): "
                f"{same} — **{'met' if all(same.values()) else 'missed'}**"
            )
        return lines
    return loop_targets(result["summary"])


def markdown(result: dict[str, Any]) -> str:
    summary = result["summary"]
    rows = list(summary)
    lines = [
        _common.start("meta"),
        (f"`python -m benchmarks paired {shlex.join(result['argv'])}` on {result['machine']}, "
        f"{result['started']}, commit {_common.commit_words(result['commit'], result['dirty'])}: {WORKLOADS[result.get('workload', 'tiny')].description}, "
        f"{result['clients']} closed-loop clients, {result['rounds']} rounds of {result['seconds']:g} s blocks "
        "(rows in a fresh random order each round). Medians over rounds, [intervals] from order "
        f"statistics (coverage {100 * stats.median_interval([0.0] * result['rounds']).coverage:.1f}% "
        f"with {result['rounds']} rounds)."),
        _common.end("meta"),
        "",
        _common.start("tables"),
    ]
    table = _common.table
    lines.append(table(
        ["row", "requests/s", "latency p99 ms", "/health p99 ms", "requests/s vs default", "/health p99 vs default"],
        [[row, _fmt(summary[row]["values"]["requests_per_s"], 1), _fmt(summary[row]["values"]["p99_ms"], 0),
          _fmt(summary[row]["values"]["health_p99_ms"], 1),
          _ratio_cell(summary[row], "requests_per_s", higher="faster", lower="slower"),
          _ratio_cell(summary[row], "health_p99_ms", higher="slower", lower="faster")] for row in rows]))
    lines += ["CPU per completed request (ms), from `/proc`:", ""]
    lines.append(table(
        ["row", *PART_NAMES.values(), "projected ceiling of one API server (req/s)",
         "load generator (the clients, not the server)"],
        [[row, *(_fmt(v[f"cpu:{p}"]) if f"cpu:{p}" in v else "–" for p in PART_NAMES), _fmt(v["ceiling"], 0),
          _fmt(v["client"]) if "client" in v else "–"]
         for row, v in ((row, summary[row]["values"]) for row in rows)]))
    lines += ["Paired ratios to vLLM default (per round; < 1 is less CPU):", ""]
    lines.append(table(
        ["row", *PART_NAMES.values(), "projected ceiling"],
        [[row, *(_ratio_cell(summary[row], f"cpu:{p}", higher="more", lower="less") for p in PART_NAMES),
          _ratio_cell(summary[row], "ceiling", higher="higher", lower="lower")] for row in rows if row != DEFAULT]
    ).rstrip("\n"))
    spawned = {row: sum(b["new_workers"] for b in result["blocks"][row]) for row in rows}
    errors = {row: sum(b["errors"] for b in result["blocks"][row]) for row in rows}
    lines += ["", *projection(result)]
    lines += [
        "",
        (f"Worker processes spawned during measured blocks: {spawned}. Failed requests: {errors}. "
        f"Server start-up (all rows at once): {result['startup_s']:.0f} s."),
        _common.end("tables"),
        "",
        _common.start("targets"),
        *_targets(result),
        _common.end("targets"),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = _common.parser(__doc__ or "", "paired", smoke="vLLM's default and thread (process where the workload checks no answers; --rows names others), one worker each, one round of 1 s blocks at 8 clients")
    p.add_argument("--rows", nargs="+", choices=ROWS, help="default: every row")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="tiny")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    workload = WORKLOADS[args.workload]
    if args.smoke:
        smoke_row = "thread" if workload.checks_answers else "process"
        rows, rounds, seconds, clients = args.rows or [DEFAULT, smoke_row], 1, 1.0, 8
    else:
        rows, rounds, seconds, clients = args.rows or list(ROWS), args.rounds, args.seconds, args.clients
    if DEFAULT not in rows:
        rows = [DEFAULT, *rows]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    commit, dirty = _common.machine()["commit"], _common.dirty()
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        model = workload.model(Path(tmp) / workload.model_dir)
        bodies, path = workload.bodies(str(model), args.smoke), workload.route
        began = time.perf_counter()
        # Started together; all stay up.
        with progress.phase(f"starting {len(rows)} vLLM servers", 60 + 15 * len(rows)):
            servers = stack.enter_context(
                running_servers(
                    {row: config(row, args.smoke) for row in rows},
                    model,
                    {row: args.out / "logs" / f"paired-{row.replace(' ', '-')}.log" for row in rows},
                )
            )
        startup_s = time.perf_counter() - began
        with progress.phase("warming up every server"):
            for url, pid in servers.values():  # not measured
                measure_block(url, pid, min(clients, 8), bodies, 0.5 if args.smoke else 2.0, path)
        same = same_answers(servers, path, bodies) if workload.checks_answers else None
        blocks: dict[str, list[dict[str, Any]]] = {row: [] for row in rows}
        for round_number, row, bar in progress.interleaved(rows, rounds, args.seed, "paired blocks"):
            block = measure_block(*servers[row], clients, bodies, seconds, path)
            blocks[row].append(block)
            bar.note(f"round {round_number + 1} {row}: {block['requests_per_s']:.1f} requests/s, loop thread "
                     f"{block['cpu_ms_per_request']['loop']:.2f} ms CPU a request, {block['errors']} errors")
    result = {
        "argv": argv, "machine": _common.machine_words(),
        "started": started, "commit": commit, "dirty": dirty, "workload": args.workload, "rounds": rounds, "seconds": seconds, "clients": clients,
        "startup_s": startup_s, "blocks": blocks, "summary": summarize(blocks),
        **({"same_answers": same} if same is not None else {}),
    }
    stem = "paired" if args.workload == "tiny" else f"paired-{args.workload}"
    _common.write(args.out, stem, result, markdown(result))
    print(f"wrote {args.out / stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
