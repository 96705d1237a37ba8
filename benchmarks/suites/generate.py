"""Generate benchmark: open-loop Poisson chat traffic, text and images, as the seeds measured it.

vLLM's pull requests that moved chat rendering and multimodal processing off
the loop measured streamed multimodal chats arriving at a Poisson rate, with a
client that gives up after 10 s: time to first token, vLLM's `/health` and the
share of requests timed out. This does the same on one tiny Idefics3 (random
weights, built locally: its Hugging Face processor resizes and tiles every
image as a real one does, its forward costs almost nothing), so what is
measured is the API server's frontend.

Rows, every server started together: vLLM's default, vLLM with
`--renderer-num-workers 4`, vLLM with `--api-server-count 2`, and offload
under `thread`, `process` and `async-renderer` (each with its health port,
probed too). Workloads: `mixed` (40% text chats, 60% chats with one base64
JPEG of 256, 512 or 1024 pixels) at each `--rates` rate, and `text` (text
chats only, at `--text-rate`) for the no-regression check. Each round runs
every (workload, rate, row) level once, in a fresh random order; the tables
give medians over rounds with their intervals.

Every server: `--mm-processor-cache-gb 0` (several renderers cannot share
vLLM's cache, decision 0030; every image here is new anyway), the model in the
engine core's process and no torch.compile (the model's time is not what is
measured), 8 generated tokens a chat.

    python -m benchmarks generate                       # 5 rounds x 8 s levels, about 25 min
    python -m benchmarks generate --rows "offload process" "offload process nice 0" --rates 20
    python -m benchmarks generate --rows "offload thread" "offload thread nice 0" --rates 20
    python -m benchmarks generate --smoke --out DIR

Writes generate.json and generate.md into --out (default
.benchmarks/runs/generate/).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks.harness import common as _common
from benchmarks.harness import load, mm_models, progress, stats, workloads
from benchmarks.harness.mixed import poisson_arrivals
from benchmarks.harness.server import (
    ENGINE_IN_ONE_PROCESS,
    HOST,
    ServerConfig,
    free_port,
    running_servers,
)
from offload._lag import percentile

SMOKE_TIMEOUT_S = 900
CLIENT_TIMEOUT_S = 10.0
MAX_TOKENS = 8
IMAGE_SIZES = (256, 512, 1024)
#: Of the mixed workload's chats, the share with no image; the rest split evenly by size.
TEXT_SHARE = 0.4
BASELINE = "vLLM default"
OFFLOAD_ROWS = ("thread", "process", "async-renderer")
#: Rows run only when `--rows` names them: an offload row with one setting
#: changed, `name -> (strategy, environment)`. `thread` and `process` workers
#: run at nice 10 by default (`OFFLOAD_VLLM_WORKER_NICE`), below the API server
#: and the engine: these rows ask what that costs a chat's time to first token
#: on a busy host.
VARIANT_ROWS = {
    f"offload {strategy} nice 0": (strategy, {"OFFLOAD_VLLM_WORKER_NICE": "0"}) for strategy in ("thread", "process")
}
SERVER_ARGS = (
    "--runner", "generate", "--max-model-len", "512", "--max-num-seqs", "64",
    "--kv-cache-memory-bytes", "64M", "--enforce-eager", "--mm-processor-cache-gb", "0",
)


def configs(smoke: bool, only: list[str] | None = None) -> tuple[dict[str, ServerConfig], dict[str, str]]:
    """The rows' servers, and the health port's URL of each offload row (one
    port each): every row but `VARIANT_ROWS`, or those in `only` (vLLM's
    default always among them: every ratio is to it)."""
    env = dict(ENGINE_IN_ONE_PROCESS)
    rows = {
        BASELINE: ServerConfig(BASELINE, None, SERVER_ARGS, env),
        "vLLM renderer-num-workers 4": ServerConfig("vLLM renderer-num-workers 4", None,
                                                    (*SERVER_ARGS, "--renderer-num-workers", "4"), env),
        "vLLM api-server-count 2": ServerConfig("vLLM api-server-count 2", None,
                                                (*SERVER_ARGS, "--api-server-count", "2"), env),
    }
    health: dict[str, str] = {}
    offload = {f"offload {strategy}": (strategy, {}) for strategy in OFFLOAD_ROWS}
    for name, (strategy, own_env) in {**offload, **VARIANT_ROWS}.items():
        if name in VARIANT_ROWS and name not in (only or ()):
            continue
        port = free_port()
        rows[name] = ServerConfig(name, strategy, (*SERVER_ARGS, "--offload-health-port", str(port)), {**env, **own_env})
        health[name] = f"http://{HOST}:{port}"
    if smoke:
        return {"offload process": rows["offload process"]}, {"offload process": health["offload process"]}
    if only:
        rows = {name: config for name, config in rows.items() if name == BASELINE or name in only}
        health = {name: url for name, url in health.items() if name in rows}
    return rows, health


#: Every row `--rows` may name.
ROW_NAMES = (BASELINE, "vLLM renderer-num-workers 4", "vLLM api-server-count 2",
             *(f"offload {s}" for s in OFFLOAD_ROWS), *VARIANT_ROWS)


def chat_bodies(model: str, *, count: int, text_only: bool, seed: int = 0) -> list[bytes]:
    """`count` streamed chats in a fixed shuffled order: all text, or the mixed
    workload's share of text and of one image per size (each image drawn anew)."""
    rng = random.Random(seed)
    bodies = []
    for n in range(count):
        words = " ".join(rng.choice(("tokens", "images", "loops", "servers", "queues")) for _ in range(40))
        content: Any = f"Describe what follows in a sentence. {words}"
        if not text_only and rng.random() >= TEXT_SHARE:
            size = IMAGE_SIZES[n % len(IMAGE_SIZES)]
            url = f"data:image/jpeg;base64,{workloads.photo_jpeg_base64(size, rng.randrange(2**31))}"
            content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": content}]
        bodies.append(json.dumps({
            "model": model, "messages": [{"role": "user", "content": content}], "stream": True,
            "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0,
        }).encode())
    return bodies


async def _open_loop(url: str, bodies: list[bytes], arrivals: list[float]) -> dict[str, Any]:
    """Each body sent at its arrival time (s from now), whatever the earlier
    ones' answers; a request not answered whole within `CLIENT_TIMEOUT_S` is
    abandoned and counted as timed out. TTFT: until the stream's first event
    (vLLM sends its first chunk with the first token)."""
    import aiohttp

    ttft: list[float] = []
    done_at: list[float] = []
    ended: Counter[str] = Counter()

    async def one(session: Any, body: bytes) -> None:
        t0 = time.monotonic()
        first = None
        try:
            async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
                async for _ in resp.content.iter_any():
                    first = first or time.monotonic()
                ended[str(resp.status)] += 1
                if resp.status == 200 and first is not None:
                    ttft.append(first - t0)
                    done_at.append(time.monotonic())
        except asyncio.TimeoutError:
            ended["timeout"] += 1
        except aiohttp.ClientError:
            ended["error"] += 1

    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        start = time.monotonic()
        tasks = []
        for n, at in enumerate(arrivals):
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            tasks.append(asyncio.create_task(one(session, bodies[n % len(bodies)])))
        window = time.monotonic() - start
        await asyncio.gather(*tasks)
    ordered = sorted(ttft)
    sent = len(arrivals)
    return {
        "sent": sent, "ended": dict(ended),
        "timeout_share": ended["timeout"] / sent if sent else 0.0,
        "error_share": (sent - ended["200"] - ended["timeout"]) / sent if sent else 0.0,
        "ttft_mean_ms": 1e3 * sum(ordered) / len(ordered) if ordered else float("nan"),
        "ttft_p99_ms": 1e3 * percentile(ordered, 99) if ordered else float("nan"),
        "requests_per_s": sum(t - start <= window for t in done_at) / window if window > 0 else 0.0,
    }


def run_level(url: str, health: str | None, bodies: list[bytes], rate: float, seconds: float, seed: int) -> dict[str, Any]:
    """One level: Poisson arrivals at `rate` for `seconds`, `/health` probed on
    the serving port (and on the health port, where there is one) from other processes."""
    arrivals = poisson_arrivals(rate, seconds, random.Random(seed))
    with ExitStack() as stack:
        probers = {"serving": stack.enter_context(load.HealthProber(url))}
        if health is not None:
            probers["health_port"] = stack.enter_context(load.HealthProber(health))
        result = asyncio.run(_open_loop(url + "/v1/chat/completions", bodies, arrivals))
    return {**result, "health": {name: p.summary() for name, p in probers.items()}}


def _interval(values: list[float]) -> dict[str, float] | None:
    kept = [v for v in values if not math.isnan(v)]  # NaN: no 200 in that level
    return stats.median_interval(kept).__dict__ if kept else None


METRICS = {
    "ttft_mean_ms": ("TTFT mean ms", 0), "ttft_p99_ms": ("TTFT p99 ms", 0), "requests_per_s": ("requests/s", 1),
    "health_p50_ms": ("/health p50 ms", 1), "health_p99_ms": ("/health p99 ms", 1),
    "health_port_p99_ms": ("health port p99 ms", 1), "timeout_share": ("timed out", 3), "error_share": ("errors", 3),
}


def _values(level: dict[str, Any]) -> dict[str, float]:
    health = level["health"]
    return {
        **{k: level[k] for k in ("ttft_mean_ms", "ttft_p99_ms", "requests_per_s", "timeout_share", "error_share")},
        "health_p50_ms": health["serving"]["p50_ms"], "health_p99_ms": health["serving"]["p99_ms"],
        **({"health_port_p99_ms": health["health_port"]["p99_ms"]} if "health_port" in health else {}),
    }


def summarize(levels: dict[str, list[dict[str, Any]]], plan: dict[str, tuple[str, float, str]]) -> dict[str, dict[str, Any]]:
    """Per level (`level_key`): each metric's median over rounds with its
    interval, and TTFT p99 per round over vLLM default's at the same workload and rate."""
    out: dict[str, dict[str, Any]] = {}
    for key, rounds in levels.items():
        values = [_values(level) for level in rounds]
        out[key] = {m: _interval([v[m] for v in values if m in v]) for m in METRICS}
        workload, rate, row = plan[key]
        base = levels.get(level_key(workload, rate, BASELINE))
        if base and row != BASELINE:
            ratios = [lv["ttft_p99_ms"] / b["ttft_p99_ms"] for lv, b in zip(rounds, base, strict=True) if b["ttft_p99_ms"]]
            out[key]["ttft_p99_ratio"] = _interval(ratios)
    return out


def level_key(workload: str, rate: float, row: str) -> str:
    return f"{workload} {rate:g}/s {row}"


def markdown(result: dict[str, Any]) -> str:
    summary = result["summary"]
    lines = [_common.start("meta"), _common.run_line(result), "", (
        f"{result['rounds']} rounds of {result['seconds']:g} s levels, Poisson arrivals, streamed chats of "
        f"{MAX_TOKENS} tokens, a {CLIENT_TIMEOUT_S:g} s client timeout; median [interval] over rounds."),
        _common.end("meta"), "", _common.start("tables")]
    headers = ["level", *(label for label, _ in METRICS.values()), "TTFT p99 / default's"]
    rows = []
    for key, metrics in summary.items():
        rows.append([key, *(stats.fmt(metrics[m], d) for m, (_, d) in METRICS.items()),
                     stats.fmt(metrics.get("ttft_p99_ratio"))])
    lines += [_common.table(headers, rows), _common.end("tables"), "", _common.start("targets")]
    lines += [f"- {goal}" for goal in result["goals"]]
    lines += [_common.end("targets"), ""]
    return "\n".join(lines)


def goals(summary: dict[str, dict[str, Any]], rates: list[float], text_rate: float) -> list[str]:
    """The goals' verdicts, from the intervals (`stats.target_verdict`)."""
    said = []
    for rate in rates:
        for strategy in OFFLOAD_ROWS:
            h = summary.get(level_key("mixed", rate, f"offload {strategy}"), {}).get("health_p99_ms")
            if h:
                said.append(f"vLLM `/health` p99 ≤ 10 ms, `{strategy}` at {rate:g}/s: "
                            f"{stats.fmt(h, 1)} ms, {stats.target_verdict(h['low'], h['median'], h['high'], 10)}")
    timing_out = [r for r in rates if (t := summary.get(level_key("mixed", r, BASELINE), {}).get("timeout_share"))
                  and t["median"] > 0]
    if timing_out:
        rate = timing_out[0]
        row = summary.get(level_key("mixed", rate, "offload process"), {})
        if (ratio := row.get("ttft_p99_ratio")) is not None:
            said.append(f"`process` TTFT p99 ≤ 0.5x vLLM default's at {rate:g}/s, where the default first times "
                        f"out: {stats.fmt(ratio)}, {stats.target_verdict(ratio['low'], ratio['median'], ratio['high'], 0.5)}")
        if (t := row.get("timeout_share")) is not None:
            said.append(f"`process` timed out at {rate:g}/s: {stats.fmt(t, 3)} of requests "
                        f"(vLLM default: {stats.fmt(summary[level_key('mixed', rate, BASELINE)]['timeout_share'], 3)})")
    elif rates:
        said.append(f"vLLM's default timed out at none of the rates run (up to {max(rates):g}/s)")
    for strategy in OFFLOAD_ROWS:
        ratio = summary.get(level_key("text", text_rate, f"offload {strategy}"), {}).get("ttft_p99_ratio")
        if ratio:
            inside = ratio["low"] <= 1 <= ratio["high"]
            said.append(f"text-only chat at {text_rate:g}/s, `{strategy}` TTFT p99 / default's: {stats.fmt(ratio)}"
                        f" ({'within the interval' if inside else 'outside the interval'} of 1)")
    return said


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = _common.parser(__doc__ or "", "generate", smoke="one offload row, one round of 2 s levels at 2/s")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=8.0, help="arrivals per level (s)")
    p.add_argument("--rates", default="5,10,20,40", help="the mixed workload's rates (requests/s), comma-separated")
    p.add_argument("--text-rate", type=float, default=10.0, help="the text-only workload's rate (requests/s)")
    p.add_argument("--rows", nargs="+", choices=ROW_NAMES,
                   help=f"default: every row but {', '.join(VARIANT_ROWS)}; vLLM's default is always run")
    args = p.parse_args(argv)
    rates = [2.0] if args.smoke else [float(r) for r in args.rates.split(",")]
    text_rate = 2.0 if args.smoke else args.text_rate
    rounds, seconds = (1, 2.0) if args.smoke else (args.rounds, args.seconds)
    if rounds < 1 or seconds <= 0 or not rates or min(rates) <= 0:
        p.error("--rounds, --seconds and every rate must be positive")
    servers, health_urls = configs(args.smoke, args.rows)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    loadavg_before = _common.loadavg()
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        model = mm_models.build_tiny_multimodal_model(Path(tmp) / mm_models.TINY_IDEFICS3_NAME)
        with progress.phase(f"starting {len(servers)} vLLM servers", 90.0 * len(servers)):
            urls = stack.enter_context(running_servers(
                servers, model, {name: args.out / "logs" / f"generate-{name.replace(' ', '-')}.log" for name in servers},
            ))
        mixed = chat_bodies(str(model), count=64, text_only=False)
        text = chat_bodies(str(model), count=64, text_only=True)
        for url, _ in urls.values():  # warm-up, not measured: the first requests allocate
            asyncio.run(_open_loop(url + "/v1/chat/completions", mixed, poisson_arrivals(4.0, 1.0, random.Random(-1))))
        plan = [("mixed", rate, row) for rate in rates for row in servers]
        plan += [("text", text_rate, row) for row in servers if row == BASELINE or row.startswith("offload")]
        keys = {level_key(*entry): entry for entry in plan}
        levels: dict[str, list[dict[str, Any]]] = {key: [] for key in keys}
        for number, key, bar in progress.interleaved(list(keys), rounds, seed=0, desc="generate levels"):
            workload, rate, row = keys[key]
            level = run_level(urls[row][0], health_urls.get(row), mixed if workload == "mixed" else text,
                              rate, seconds, seed=number)
            levels[key].append(level)
            bar.note(f"round {number + 1} {key}: {json.dumps(_values(level))}")
    summary = summarize(levels, keys)
    result = {
        "command": _common.command("generate", argv), "machine": _common.machine(), "dirty": _common.dirty(),
        "started": started, "loadavg_before": loadavg_before, "loadavg_after": _common.loadavg(),
        "rounds": rounds, "seconds": seconds, "rates": rates, "text_rate": text_rate,
        "servers": {name: config.shown() for name, config in servers.items()},
        "levels": levels, "summary": summary, "goals": goals(summary, rates, text_rate),
    }
    _common.write(args.out, "generate", result, markdown(result))
    print(f"wrote the results into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
