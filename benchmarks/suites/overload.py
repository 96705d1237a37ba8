"""Overload benchmark: a vLLM pooling server at 128 clients, with and without a queue bound.

Two servers (same strategy and workers; one with `OFFLOAD_VLLM_MAX_QUEUE`) run
side by side; levels alternate between them (A B, B A, ...) so that the
machine's drift falls on both rows alike. For each level: accepted-request
latency (200s only), 503s, requests/s, and `/health` latency probed from
another process (`benchmarks.harness.load.HealthProber`).

A client refused with 503 waits the `Retry-After` it got, times
`--retry-fraction` (default 1: a client that honours the header; 0.1 keeps
more pressure on), and sends its next request.

    python -m benchmarks overload                 # 5 pairs x 15 s, tiny model
    python -m benchmarks overload --smoke --out DIR
    python -m benchmarks overload --readiness --pairs 3

`--max-queued-cost N`: the bounded server is bounded by
`OFFLOAD_VLLM_MAX_QUEUED_COST=N` (cost: characters) instead of
`OFFLOAD_VLLM_MAX_QUEUE`.

`--readiness`: the bounded server also serves the health port
(`OFFLOAD_VLLM_HEALTH_PORT`), and with every request its clients send, they
send `GET /ready` to that port at the same moment (on connections of their
own); each request's answer (200: admitted, 503: refused) is paired with
what readiness answered. The report gives, over the bounded row's levels,
the share of refused requests that readiness answered 503 for, and of
admitted ones that it answered 200 for (the goal: >= 95% each). Beside it,
the same shares measured in the server, at the moment each default-lane
request was admitted or refused (`offload_vllm_readiness_at_admission_total`,
read from the bounded server's `/metrics` before and after each level): what
`/ready` answered at the decision itself, where the client's `/ready` was
answered at the moment the request was sent.

Writes overload.json and overload.md into --out (default
.benchmarks/runs/overload/). How a computed `Retry-After` compared with a
constant 1 s is decision record 0025, with the commit that reruns it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks.harness import common as _common
from benchmarks.harness import load, models, progress, workloads
from benchmarks.harness.server import HOST, ServerConfig, free_port, running_servers

ROOT = Path(__file__).resolve().parents[2]

# Starting two real servers is most of the smoke run; the smoke test allows this much.
SMOKE_TIMEOUT_S = 900

CLIENTS = 128
STRATEGY = "thread"
WORKERS = 2
#: 2 workers + 30: at most 32 requests in flight in the server (a quarter of the
#: 128 clients), enough for the engine to batch, few enough not to queue long.
MAX_QUEUE = 30


async def _level(
    url: str, clients: int, make_payload: Any, seconds: float, retry_fraction: float = 1.0,
    ready_url: str | None = None,
) -> dict[str, Any]:
    import aiohttp

    accepted: list[float] = []
    statuses: dict[int, int] = {}
    #: The `Retry-After` header's values on the 503s -> how many.
    told: dict[str, int] = {}
    #: (request's status, readiness's status) -> how many (`ready_url`).
    side_by_side: dict[tuple[int, int], int] = {}
    #: `SEND_BIN_S` of send time -> [admitted, refused] requests sent in it (`ready_url`).
    send_bins: dict[int, list[int]] = {}
    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=load.REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients), timeout=timeout) as probes:

        async def ready() -> int:
            assert ready_url is not None
            try:
                async with probes.get(ready_url) as answer:
                    await answer.read()
                    return answer.status
            except (aiohttp.ClientError, OSError):
                return 0
        start = time.perf_counter()
        stop = start + seconds
        issued = 0

        async def client() -> None:
            nonlocal issued
            while time.perf_counter() < stop:
                payload = make_payload(issued)
                issued += 1
                t0 = time.perf_counter()
                # Sent in the same turn of this loop as the request: readiness at its moment.
                readiness = asyncio.ensure_future(ready()) if ready_url is not None else None
                try:
                    async with session.post(url, json=payload) as resp:
                        await resp.read()
                        status = resp.status
                        header = resp.headers.get("Retry-After", "")
                        retry_after = float(header or 0)
                        if status == 503:
                            told[header] = told.get(header, 0) + 1
                except aiohttp.ClientConnectionError:
                    # No answer: the connection dropped (a kept-alive one the server
                    # closed as this request went out). Counted as status 0, not fatal.
                    status, retry_after = 0, 0.0
                statuses[status] = statuses.get(status, 0) + 1
                if readiness is not None:
                    pair = (status, await readiness)
                    side_by_side[pair] = side_by_side.get(pair, 0) + 1
                    if status in (200, 503):
                        send_bins.setdefault(int(t0 / SEND_BIN_S), [0, 0])[status == 503] += 1
                if status == 200:
                    accepted.append(time.perf_counter() - t0)
                elif status == 503:
                    # Not past the level's end: a wait there would only stretch
                    # its wall time (and so lower its accepted/s) without a request.
                    await asyncio.sleep(min(retry_after * retry_fraction, max(0.0, stop - time.perf_counter())))

        await asyncio.gather(*(client() for _ in range(clients)))
        wall = time.perf_counter() - start
    stats = load.summarize_ms(accepted)
    return {
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "retry_after_told": told,
        **({"side_by_side": {f"{a} {r}": n for (a, r), n in sorted(side_by_side.items())},
            "send_bins": {str(k): v for k, v in send_bins.items()}} if ready_url else {}),
        "accepted_per_s": len(accepted) / wall,
        "accepted_p50_ms": stats["p50_ms"],
        "accepted_p99_ms": stats["p99_ms"],
        "duration_s": wall,
    }


def run_level(
    base_url: str, clients: int, make_payload: Any, seconds: float, retry_fraction: float = 1.0,
    ready_url: str | None = None,
) -> dict[str, Any]:
    before = decisions_counted(base_url) if ready_url else {}
    with load.HealthProber(base_url) as prober:
        result = asyncio.run(
            _level(base_url + "/v1/embeddings", clients, make_payload, seconds, retry_fraction, ready_url)
        )
    result["health"] = prober.summary()
    if ready_url:
        after = decisions_counted(base_url)
        result["at_decision"] = {key: after[key] - before.get(key, 0) for key in after}
    return result


#: The server's count of admission decisions by what `/ready` answered then
#: (`offload_vllm._health.READINESS_AT_ADMISSION`).
DECISIONS = "offload_vllm_readiness_at_admission_total"


def decisions_counted(base_url: str) -> dict[str, int]:
    """`"<request's status> <readiness's status>"` -> admission decisions the
    server at `base_url` counted so far, keyed as `_level`'s `side_by_side`
    (admitted: 200, refused: 503)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    counted: dict[str, int] = {}
    for family in text_string_to_metric_families(httpx.get(f"{base_url}/metrics", timeout=30).text):
        for sample in family.samples:
            if sample.name == DECISIONS:
                status = "200" if sample.labels["decision"] == "admitted" else "503"
                counted[f"{status} {sample.labels['ready']}"] = int(sample.value)
    return counted


def agreement(levels: list[dict[str, Any]], pairs: str = "side_by_side") -> dict[str, Any]:
    """Readiness beside admission over `levels` (`--readiness`): per level and
    pooled, the share of refused requests (503) readiness answered 503 for,
    and of admitted ones (200) it answered 200 for, and the pooled `counts`,
    from each level's `pairs`: `"side_by_side"` (the clients' `/ready`, sent
    with each request) or `"at_decision"` (the server's count, at each
    decision). Of `"side_by_side"`, also `best_admitted_ready`, and under
    `"server"` the same shares from `"at_decision"`."""
    def share(counts: dict[str, int], status: str) -> float | None:
        mine = {key: n for key, n in counts.items() if key.split()[0] == status}
        total = sum(mine.values())
        return mine.get(f"{status} {status}", 0) / total if total else None

    out: dict[str, Any] = {}
    pooled: dict[str, int] = {}
    for level in levels:
        for key, n in level.get(pairs, {}).items():
            pooled[key] = pooled.get(key, 0) + n
    for name, status in (("refused_not_ready", "503"), ("admitted_ready", "200")):
        per_level = [x for x in (share(level.get(pairs, {}), status) for level in levels) if x is not None]
        out[name] = {"per_level": per_level, "pooled": share(pooled, status)}
    out["counts"] = pooled
    if pairs == "side_by_side":
        out["best_admitted_ready"] = {
            "per_level": [x for x in (best_admitted_ready(level.get("send_bins", {})) for level in levels) if x is not None],
        }
        out["server"] = agreement(levels, "at_decision")
    return out


#: The width of the send-time bins of `best_admitted_ready`, in seconds.
SEND_BIN_S = 0.005
#: The share of refused requests readiness should answer 503 for (the goal).
REFUSED_GOAL = 0.95


def best_admitted_ready(send_bins: dict[str, list[int]]) -> float | None:
    """The most admitted requests any readiness could answer 200 for while it
    answers 503 for `REFUSED_GOAL` of the refused ones, if it could only change
    its answer every `SEND_BIN_S` (even knowing each request's fate): where
    refused and admitted requests are sent in the same few ms (a herd), no
    answer at their moment tells them apart. Bins are taken for 503 in order
    of refused per admitted (greedy). `None` without refusals."""
    bins = sorted(send_bins.values(), key=lambda b: b[1] / (b[0] + 1e-9), reverse=True)
    admitted, refused = sum(b[0] for b in bins), sum(b[1] for b in bins)
    if not refused or not admitted:
        return None
    covered = lost = 0
    for ok, no in bins:
        if covered >= REFUSED_GOAL * refused:
            break
        covered, lost = covered + no, lost + ok
    return 1 - lost / admitted


def readiness_line(agreed: dict[str, Any]) -> str:
    """What `agreement` found, in sentences: at each decision (the server's
    count), then as the clients saw it (their `/ready`, sent with each request)."""
    def shares(found: dict[str, Any]) -> str:
        def pooled(name: str) -> str:
            value = found[name]["pooled"]
            return _percent([value] if value is not None else [])

        counts = found.get("counts", {})
        refused = sum(n for key, n in counts.items() if key.startswith("503 "))
        admitted = sum(n for key, n in counts.items() if key.startswith("200 "))
        return (f"of {refused} refused requests, `/ready` answered 503 for "
                f"{_percent(found['refused_not_ready']['per_level'])}, pooled {pooled('refused_not_ready')}; "
                f"of {admitted} admitted ones, 200 for {_percent(found['admitted_ready']['per_level'])}, "
                f"pooled {pooled('admitted_ready')}")

    best = agreed.get("best_admitted_ready", {}).get("per_level", [])
    server = agreed.get("server")
    at_decision = (f"Readiness at each admission decision (the bounded server's count, "
                   f"`{DECISIONS}`): {shares(server)}. ") if server and server.get("counts") else ""
    return (f"{at_decision}Readiness beside admission as the clients saw it (the bounded server's `/ready`, "
            f"sent with each request): {shares(agreed)}. "
            f"The most admitted requests any readiness answering 503 for {100 * REFUSED_GOAL:.0f}% of the refused "
            f"could answer 200 for at their sending, changing its answer at most every {1000 * SEND_BIN_S:g} ms "
            f"of send time: {_percent(best)}.")


def _percent(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) < 2:
        return f"{100 * values[0]:.1f}%"
    return (f"{100 * statistics.median(values):.1f}% (median of {len(values)} levels; range "
            f"{100 * min(values):.1f}-{100 * max(values):.1f}%)")


def _interval(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.2f}" if values else "-"
    # The median of the per-pair ratios, and their range: with 5 pairs the
    # range covers the median with 94% (order statistics), no normality assumed.
    return f"{statistics.median(values):.2f} (median of {len(values)} pairs; range {min(values):.2f}-{max(values):.2f})"


def markdown(result: dict[str, Any]) -> str:
    rows = result["rows"]
    lines = [
        "<!-- --8<-- [start:meta] -->",
        (f"`python -m benchmarks overload {' '.join(result['argv'])}` on {result['machine']}, "
        f"{result['started']}: model {result['model']}, strategy `{STRATEGY}` with {WORKERS} workers, "
        f"{result['clients']} closed-loop clients, {result['pairs']} interleaved pairs of {result['seconds']:.0f} s levels; "
        f"a refused client waits {result.get('retry_fraction', 0.1):g} x `Retry-After`."),
        "<!-- --8<-- [end:meta] -->",
        "",
        "<!-- --8<-- [start:tables] -->",
        "| row | accepted/s | accepted p50 ms | accepted p99 ms | 503s | /health p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    for name, levels in rows.items():
        lines.append(
            f"| {name} | {statistics.mean(x['accepted_per_s'] for x in levels):.1f} "
            f"| {statistics.mean(x['accepted_p50_ms'] for x in levels):.0f} "
            f"| {statistics.mean(x['accepted_p99_ms'] for x in levels):.0f} "
            f"| {sum(x['statuses'].get('503', 0) for x in levels)} "
            f"| {statistics.mean(x['health']['p99_ms'] for x in levels):.1f} |"
        )
    ratios = result["ratios"]
    lines += [
        "",
        (f"Per pair, bounded / unbounded: accepted p99 {_interval(ratios['accepted_p99'])}; "
        f"/health p99 {_interval(ratios['health_p99'])}."),
    ]
    if result.get("readiness"):
        lines += ["", readiness_line(result["readiness"])]
    lines += ["<!-- --8<-- [end:tables] -->", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="one pair of 3 s levels at 16 clients")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument(
        "--retry-fraction", type=float, default=1.0,
        help="a refused client waits Retry-After times this before its next request",
    )
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--clients", type=int, default=CLIENTS, help="closed-loop clients (not with --smoke)")
    p.add_argument(
        "--readiness", action="store_true",
        help="the bounded server serves the health port; /ready is sent beside every request and compared",
    )
    p.add_argument(
        "--max-queued-cost", type=float, default=None,
        help="bound the bounded row by OFFLOAD_VLLM_MAX_QUEUED_COST (this much cost) instead of max_queue",
    )
    p.add_argument("--out", type=Path, default=_common.RESULTS / "overload")
    args = p.parse_args(argv)
    clients = 16 if args.smoke else args.clients
    pairs, seconds = (1, 3.0) if args.smoke else (args.pairs, args.seconds)
    health_port = free_port() if args.readiness else None
    if args.max_queued_cost is not None:
        bound_name = f"max_queued_cost={args.max_queued_cost:g}"
        bound_env = {"OFFLOAD_VLLM_MAX_QUEUED_COST": f"{args.max_queued_cost:g}"}
    else:
        bound_name, bound_env = f"max_queue={MAX_QUEUE}", {"OFFLOAD_VLLM_MAX_QUEUE": str(MAX_QUEUE)}
    configs = {
        "unbounded": ServerConfig("unbounded", STRATEGY, env={"OFFLOAD_VLLM_WORKERS": str(WORKERS)}),
        bound_name: ServerConfig(
            bound_name, STRATEGY,
            env={"OFFLOAD_VLLM_WORKERS": str(WORKERS), **bound_env,
                 **({"OFFLOAD_VLLM_HEALTH_PORT": str(health_port)} if health_port else {})},
        ),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        model = models.build_tiny_embedding_model(Path(tmp) / models.EMBED_NAME)
        urls = {
            name: url
            for name, (url, _) in stack.enter_context(
                running_servers(
                    {name: config.for_smoke() if args.smoke else config for name, config in configs.items()},
                    model,
                    {name: args.out / "logs" / f"overload-{name}.log" for name in configs},
                )
            ).items()
        }
        make_payload = workloads.long_text_factory(str(model))
        for url in urls.values():  # warm-up, not measured: first requests allocate
            asyncio.run(_level(url + "/v1/embeddings", 4, make_payload, 2.0))
        rows: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
        names = list(configs)
        with progress.Progress(pairs * len(names), "overload levels") as bar:
            for pair in range(pairs):
                order = names if pair % 2 == 0 else names[::-1]
                for name in order:
                    ready_url = f"http://{HOST}:{health_port}/ready" if health_port and name != "unbounded" else None
                    level = run_level(urls[name], clients, make_payload, seconds, args.retry_fraction,
                                      ready_url=ready_url)
                    rows[name].append(level)
                    bar.step(f"pair {pair + 1} {name}")
                    bar.note(f"pair {pair + 1} {name}: {json.dumps(level)}")
    bounded, unbounded = rows[names[1]], rows[names[0]]
    ratios = {
        "accepted_p99": [b["accepted_p99_ms"] / u["accepted_p99_ms"] for b, u in zip(bounded, unbounded, strict=True) if u["accepted_p99_ms"]],
        "health_p99": [b["health"]["p99_ms"] / u["health"]["p99_ms"] for b, u in zip(bounded, unbounded, strict=True) if u["health"]["p99_ms"]],
    }
    result = {
        "argv": argv, "machine": f"{platform.machine()} {load_cpus()} CPUs", "started": started,
        "model": "tiny BERT embedding (random weights, built locally)", "pairs": pairs, "seconds": seconds,
        "clients": clients, "retry_fraction": args.retry_fraction, "rows": rows, "ratios": ratios,
        **({"readiness": agreement(bounded)} if health_port else {}),
    }
    (args.out / "overload.json").write_text(json.dumps(result, indent=2))
    (args.out / "overload.md").write_text(markdown(result))
    if health_port:
        print(readiness_line(result["readiness"]))
    print(f"wrote the results into {args.out}")
    return 0


def load_cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    sys.exit(main())
