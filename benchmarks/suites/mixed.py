"""Mixed traffic: how long a small request waits while heavy ones flood the server.

All rows' servers are started side by side (tiny models with random weights,
built here). Each round visits the rows in a fresh random order; only the row
being measured gets traffic, and every other server's process group is
stopped (SIGSTOP) meanwhile and resumed just before its own row (the CPU the
stopped ones still use is read from `/proc` and reported: ~0).

Small requests arrive open-loop, Poisson at `--small-rate` a second (the same
schedule for every row in a round, drawn from `--seed`), on plain sockets
that read when each answer arrived (`mixed.open_loop_timed`). Per row, two
phases: *alone*, small requests for `--seconds`; *flooded*, 8 closed-loop
clients send heavy requests from another process, and after a short ramp the
small requests are sent again for `--seconds`. `/health` is probed from a
third process throughout.

The report: per row, medians over rounds with distribution-free intervals
(`harness/stats.py`) of small p50/p99 alone and flooded and their ratios,
heavy requests/s, `/health` p99; every request by its answer (lost: sent and
never answered, must be 0); per-round paired ratios against vLLM's default
and the same strategy under FIFO; a verdict per target.

    python -m benchmarks mixed                          # make bench-mixed: preprocess, 5 rounds
    python -m benchmarks mixed --variant engine --rounds 5
    python -m benchmarks mixed --rows "vLLM default" "thread fifo" --rounds 3
    python -m benchmarks mixed --smoke --out DIR

Variants (`--variant`; `VARIANTS` says what each sends): `preprocess`, `engine`,
`score`, `token-ids`, `multimodal` (skipped with a message where it cannot run).
Writes mixed-<variant>.json and .md into --out (default
.benchmarks/runs/mixed/); server logs under --out/logs/.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import common as _common
from benchmarks.harness import idle_servers, load, mixed, models, progress, stats, workloads
from benchmarks.harness.server import ServerConfig, ServerFailed, running_servers

#: Starting the smoke run's two servers is most of it (as the paired suite's).
SMOKE_TIMEOUT_S = 900

# ---- rows ------------------------------------------------------------------

DEFAULT = "vLLM default"
TWO_WORKERS = ("--offload-workers", "2")  # as many as this machine has cores
FIFO = ("--offload-scheduling", "fifo")


@dataclass(frozen=True)
class Row:
    """One row of the table: its server, and the same strategy under FIFO."""

    config: ServerConfig
    #: The same strategy under FIFO scheduling: the heavy-throughput target's baseline.
    fifo: str | None = None

    @property
    def name(self) -> str:
        return self.config.name


ROWS: dict[str, Row] = {row.name: row for row in (
    Row(ServerConfig(DEFAULT)),
    Row(ServerConfig("thread fifo", "thread", (*TWO_WORKERS, *FIFO))),
    Row(ServerConfig("process fifo", "process", (*TWO_WORKERS, *FIFO))),
    Row(ServerConfig("thread lanes", "thread", TWO_WORKERS), fifo="thread fifo"),
    Row(ServerConfig("process lanes", "process", TWO_WORKERS), fifo="process fifo"),
)}
ROW_NAMES = tuple(ROWS)
SMOKE_ROWS = (DEFAULT, "thread fifo")

# ---- variants --------------------------------------------------------------

SMALL_POOL = 64  # distinct small bodies: no two requests in a row are the same
HEAVY_POOL = 4  # distinct heavy bodies (each is large; the flood cycles through them)
HEAVY_SEED = 1000  # heavy texts differ from small ones
#: Share of RAM each server reserves for its KV cache: up to seven text servers
#: run at once; CLIP's profile run needs more (0.04 fails at start-up here).
TEXT_MEMORY = ("--gpu-memory-utilization", "0.04")
CLIP_MEMORY = ("--gpu-memory-utilization", "0.1")


@dataclass(frozen=True)
class Variant:
    description: str
    path: str
    build_model: Callable[[Path], Path]
    small: Callable[[str], workloads.Bodies]
    heavy: Callable[[str], workloads.Bodies]
    rows: tuple[str, ...] = ROW_NAMES
    server_args: tuple[str, ...] = TEXT_MEMORY


def _embed_model(root: Path) -> Path:
    return models.build_tiny_embedding_model(root / models.EMBED_NAME)


def _cross_encoder(root: Path) -> Path:
    return models.build_tiny_cross_encoder(root / models.CROSS_ENCODER_NAME)


def _clip(root: Path) -> Path:
    from benchmarks.harness.multimodal import CLIP_NAME, build_tiny_clip

    return build_tiny_clip(root / CLIP_NAME)


def _small_texts(model: str) -> workloads.Bodies:
    return workloads.bodies(workloads.text_bodies, model, count=SMALL_POOL, inputs=1, words=8)


VARIANTS: dict[str, Variant] = {
    "preprocess": Variant(
        "tiny BERT embeddings; small: one 8-word input; heavy: 16 inputs of 1500 words with "
        "`truncate_prompt_tokens: 32` (tokenization is the work, not the engine)",
        "/v1/embeddings", _embed_model, _small_texts,
        lambda m: workloads.bodies(workloads.text_bodies, m, count=HEAVY_POOL, inputs=16, words=1500, truncate=32,
                               seed=HEAVY_SEED),
    ),
    "engine": Variant(
        "tiny BERT embeddings; small: one 8-word input; heavy: 16 inputs of 150 words, untruncated "
        "(the engine shares the work)",
        "/v1/embeddings", _embed_model, _small_texts,
        lambda m: workloads.bodies(workloads.text_bodies, m, count=HEAVY_POOL, inputs=16, words=150, seed=HEAVY_SEED),
    ),
    "token-ids": Variant(
        "tiny BERT embeddings; small: one 8-word input; heavy: 16 lists of 512 token ids with "
        "`truncate_prompt_tokens: 32` (vLLM's validation of the body is the loop's work)",
        "/v1/embeddings", _embed_model, _small_texts,
        lambda m: workloads.bodies(workloads.token_id_bodies, m, count=HEAVY_POOL, inputs=16, ids=512, truncate=32,
                               seed=HEAVY_SEED),
        rows=(DEFAULT, "thread lanes", "process lanes"),
    ),
    "score": Variant(
        "tiny BERT cross-encoder on `/score`; small: one 8-word query, 2 documents of 8 words; heavy: one "
        "query, 32 documents of 750 words (as many words as the preprocess variant's heavy request), "
        "`truncate_prompt_tokens: 32`",
        "/score", _cross_encoder,
        lambda m: workloads.bodies(workloads.score_bodies, m, count=SMALL_POOL, documents=2, words=8),
        lambda m: workloads.bodies(workloads.score_bodies, m, count=HEAVY_POOL, documents=32, words=750, truncate=32,
                               seed=HEAVY_SEED),
    ),
    "multimodal": Variant(
        "tiny CLIP image embeddings (base64 JPEGs); small: one 96-pixel image; heavy: 4 images of "
        "1024 pixels (photo-like JPEGs), one conversation each",
        "/v1/embeddings", _clip,
        lambda m: workloads.bodies(workloads.image_bodies, m, count=SMALL_POOL, images=1, size=96),
        lambda m: workloads.bodies(workloads.image_bodies, m, count=HEAVY_POOL, images=4, size=1024, seed=HEAVY_SEED),
        # The multimodal processor cache cannot be shared by several renderer
        # workers: the adapter refuses thread/process with it (docs/benchmarks.md).
        server_args=(*CLIP_MEMORY, "--mm-processor-cache-gb", "0"),
    ),
}

# ---- measurement -----------------------------------------------------------

#: 10 small requests a second: about what 2 closed-loop clients sent under a
#: FIFO flood, so the flood still dominates, and some 50 per 5 s phase.
SMALL_RATE = 10.0
HEAVY_CLIENTS = 8
#: 5 rounds: the fewest whose median interval ([min, max]) reaches 93.8% coverage.
ROUNDS = 5
#: 5 s phases: at a flooded p50 of 0.5-1 s each phase still times about ten
#: small requests, and a row's round takes about 15 s.
SECONDS = 5.0
#: The flood runs this long before the small requests start: a heavy request
#: takes about 0.1 s alone here, so a second is several of them in a row.
RAMP_S = 1.0
WARMUP_S = 1.0
#: The phases small requests are sent in.
PHASES = ("alone", "flooded")


@dataclass(frozen=True)
class SmallTraffic:
    """How the small requests of a phase are sent: open loop, Poisson arrivals."""

    rate: float = SMALL_RATE
    seed: int = 0
    max_in_flight: int = mixed.MAX_IN_FLIGHT

    def schedule(self, seconds: float, round_number: int, phase: str) -> list[float]:
        """Send times of a phase: one schedule per round and phase, the same for
        every row, so that rows are offered the same requests."""
        rng = random.Random(f"small {self.seed} {round_number} {phase}")
        return mixed.poisson_arrivals(self.rate, seconds, rng)

    def run(self, url: str, bodies: list[bytes], seconds: float, round_number: int, phase: str) -> mixed.Tally:
        return mixed.run_open_timed(url, bodies, self.schedule(seconds, round_number, phase), self.max_in_flight)

    def describe(self) -> str:
        return (f"open-loop, Poisson arrivals at {self.rate:g}/s (seed {self.seed}, the same schedule for every "
                f"row in a round; at most {self.max_in_flight} in flight)")


def measure(
    url: str, small: list[bytes], heavy: workloads.Bodies, traffic: SmallTraffic, seconds: float, ramp_s: float,
    round_number: int = 0, idle_cpu: Callable[[], float] = lambda: 0.0, heavy_clients: int = HEAVY_CLIENTS,
) -> dict[str, Any]:
    """One row's two phases: small requests alone, then under the flood;
    `idle_cpu()` reads the CPU used so far by the servers not being measured."""
    cpu_before, start = idle_cpu(), time.monotonic()
    alone = traffic.run(url, small, seconds, round_number, "alone")
    alone_window = (start, time.monotonic())
    idle = {"alone": _per_s(idle_cpu() - cpu_before, alone_window)}
    with load.HealthProber(url) as prober, mixed.Flood(url, heavy, heavy_clients) as flood:
        time.sleep(ramp_s)
        cpu_before, begin = idle_cpu(), time.monotonic()
        flooded = traffic.run(url, small, seconds, round_number, "flooded")
        window = (begin, time.monotonic())
        idle["flooded"] = _per_s(idle_cpu() - cpu_before, window)
    return {
        "alone": alone.summary(alone_window),
        "flooded": flooded.summary(window),
        "heavy": flood.tally.summary(window),
        "health": prober.summary(),
        "idle_cpu_per_s": idle,
    }


def _per_s(amount: float, window: tuple[float, float]) -> float:
    begin, end = window
    return amount / (end - begin) if end > begin else 0.0


def _ratio(top: float, bottom: float) -> float | None:
    return top / bottom if bottom > 0 else None


def _phase_ratio(block: dict[str, Any], key: str) -> float | None:
    """The small requests' `key` flooded over alone; None where either phase lacks it."""
    flooded, alone = block["flooded"].get(key), block["alone"].get(key)
    return None if flooded is None or alone is None else _ratio(flooded, alone)


#: metric -> (what the report calls it, how to read it from a block; None: not measured).
#: "until the answer arrived": timed by the kernel's receive stamp (`raw_http`),
#: without the client's own wait for a CPU on this shared machine.
METRICS: dict[str, tuple[str, Callable[[dict[str, Any]], float | None]]] = {
    "alone_p50_ms": ("small p50 alone (ms)", lambda b: b["alone"]["p50_ms"] or None),
    "flooded_p50_ms": ("small p50 flooded (ms)", lambda b: b["flooded"]["p50_ms"] or None),
    "p50_ratio": ("p50 flooded / alone", lambda b: _ratio(b["flooded"]["p50_ms"], b["alone"]["p50_ms"])),
    "alone_p99_ms": ("small p99 alone (ms)", lambda b: b["alone"]["p99_ms"] or None),
    "flooded_p99_ms": ("small p99 flooded (ms)", lambda b: b["flooded"]["p99_ms"] or None),
    "p99_ratio": ("p99 flooded / alone", lambda b: _ratio(b["flooded"]["p99_ms"], b["alone"]["p99_ms"])),
    "heavy_per_s": ("heavy requests/s flooded", lambda b: b["heavy"]["requests_per_s"]),
    "health_p99_ms": ("/health p99 flooded (ms)", lambda b: b["health"]["p99_ms"]),
    "p50_ratio_arrived": ("p50 flooded / alone, until the answer arrived",
                          lambda b: _phase_ratio(b, "p50_arrived_ms")),
    "p99_ratio_arrived": ("p99 flooded / alone, until the answer arrived",
                          lambda b: _phase_ratio(b, "p99_arrived_ms")),
    "health_p99_arrived_ms": ("/health p99 flooded, until the answer arrived (ms)",
                              lambda b: b["health"].get("p99_arrived_ms")),
}
#: Metrics compared between rows, round by round.
PAIRED = ("flooded_p50_ms", "flooded_p99_ms", "heavy_per_s", "health_p99_ms", "health_p99_arrived_ms")


def _values(blocks: list[dict[str, Any]], metric: str) -> list[float | None]:
    return [METRICS[metric][1](b) for b in blocks]


def _interval(values: list[float | None]) -> dict[str, float] | None:
    present = [v for v in values if v is not None]
    return stats.median_interval(present).__dict__ if present else None


def pairs(rows: list[str]) -> list[tuple[str, str]]:
    """(row, baseline) pairs among the rows run: each row against vLLM default and its FIFO twin."""
    return [(name, base) for name in rows for base in (DEFAULT, ROWS[name].fifo)
            if base is not None and base != name and base in rows]


def paired_ratios(blocks: dict[str, list[dict[str, Any]]], row: str, base: str, metric: str) -> list[float]:
    """Per-round ratios row / base (rounds where either was not measured are left out)."""
    return [
        top / bottom
        for top, bottom in zip(_values(blocks[row], metric), _values(blocks[base], metric), strict=True)
        if top is not None and bottom
    ]


def summarize(blocks: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    summary: dict[str, Any] = {"rows": {}, "pairs": []}
    for row, row_blocks in blocks.items():
        counts = {}
        for kind in ("alone", "flooded", "heavy"):
            statuses: dict[str, int] = {}
            for b in row_blocks:
                for status, n in b[kind]["statuses"].items():
                    statuses[status] = statuses.get(status, 0) + n
            counts[kind] = {
                "sent": sum(b[kind]["sent"] for b in row_blocks),
                "statuses": statuses,
                "lost": sum(b[kind]["lost"] for b in row_blocks),
                # Due by an open-loop schedule, not sent: the in-flight bound was reached.
                "unsent": sum(b[kind].get("unsent", 0) for b in row_blocks),
            }
        idle = [b["idle_cpu_per_s"] for b in row_blocks if "idle_cpu_per_s" in b]
        summary["rows"][row] = {
            "values": {m: _interval(_values(row_blocks, m)) for m in METRICS},
            "counts": counts,
            # Per round, so that rows' offered loads can be compared.
            "small_sent": {phase: [b[phase]["sent"] for b in row_blocks] for phase in PHASES},
            "idle_cpu_per_s": {phase: _interval([i[phase] for i in idle]) for phase in PHASES} if idle else None,
            "health_failures": sum(int(b["health"].get("failures", 0)) for b in row_blocks),
        }
    for row, base in pairs(list(blocks)):
        ratios = {}
        for metric in PAIRED:
            values = paired_ratios(blocks, row, base, metric)
            ratios[metric] = stats.median_interval(values).__dict__ if values else None
        summary["pairs"].append({"row": row, "baseline": base, "ratios": ratios})
    return summary


# ---- targets ---------------------------------------------------------------

SMALL_P50_BOUND = 3.0  # small p50 flooded <= 3x alone
SMALL_P99_BOUND = 5.0  # small p99 flooded <= 5x alone
HEAVY_VS_FIFO_BOUND = 0.95  # heavy throughput >= 0.95x the same strategy under FIFO
HEAVY_VS_DEFAULT_BOUND = 0.9  # ... and >= 0.9x vLLM default's
HEALTH_P99_FLOOR_MS = 10.0  # /health p99 flooded <= max(10 ms, vLLM default's)


@dataclass(frozen=True)
class Target:
    row: str
    what: str
    metric: str
    bound: float
    at_least: bool = False
    #: None: the row's own per-round values (a ratio already); else paired with this row.
    baseline: str | None = None
    #: The bound is raised to this row's median of the same metric (an absolute
    #: target that the baseline server may itself miss, such as /health's).
    raised_to_median_of: str | None = None
    #: What the values and the bound are in: "x" (a ratio) or "ms".
    unit: str = "x"


def targets(rows: list[str]) -> list[Target]:
    """The mixed-traffic targets that the rows run can be checked against."""
    out: list[Target] = []
    for name in rows:
        row = ROWS[name]
        out += [
            Target(name, "small p50 flooded / alone", "p50_ratio", SMALL_P50_BOUND),
            Target(name, "small p99 flooded / alone", "p99_ratio", SMALL_P99_BOUND),
            Target(name, "small p50 flooded / alone, until the answer arrived", "p50_ratio_arrived",
                   SMALL_P50_BOUND),
            Target(name, "small p99 flooded / alone, until the answer arrived", "p99_ratio_arrived",
                   SMALL_P99_BOUND),
        ]
        if row.fifo in rows:
            out.append(Target(name, f"heavy requests/s vs `{row.fifo}`", "heavy_per_s", HEAVY_VS_FIFO_BOUND,
                              at_least=True, baseline=row.fifo))
        if row.config.strategy is not None and DEFAULT in rows:
            out.append(Target(name, f"heavy requests/s vs `{DEFAULT}`", "heavy_per_s", HEAVY_VS_DEFAULT_BOUND,
                              at_least=True, baseline=DEFAULT))
            out.append(Target(name, f"/health p99 flooded, until the answer arrived, vs max({HEALTH_P99_FLOOR_MS:g} ms, "
                              f"`{DEFAULT}`'s)", "health_p99_arrived_ms", HEALTH_P99_FLOOR_MS,
                              raised_to_median_of=DEFAULT, unit="ms"))
    return out


def evaluate(target: Target, blocks: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """A target's verdict: `met` is the median's side of the bound, `whole_interval`
    whether the interval lies on that side too."""
    if target.baseline is None:
        values = [v for v in _values(blocks[target.row], target.metric) if v is not None]
    else:
        values = paired_ratios(blocks, target.row, target.baseline, target.metric)
    result: dict[str, Any] = {**dataclasses.asdict(target), "interval": None, "met": None, "whole_interval": None}
    bound = target.bound
    if target.raised_to_median_of is not None:
        theirs = [v for v in _values(blocks[target.raised_to_median_of], target.metric) if v is not None]
        if not theirs:
            return result
        bound = result["bound"] = max(bound, stats.median_interval(theirs).median)
    if not values:
        return result
    interval = stats.median_interval(values)

    def within(x: float) -> bool:
        return x >= bound if target.at_least else x <= bound

    result.update(
        interval=interval.__dict__, met=within(interval.median),
        whole_interval=within(interval.low) == within(interval.high) == within(interval.median),
    )
    return result


def verdict_line(result: dict[str, Any]) -> str:
    sign = ">=" if result["at_least"] else "<="
    unit = result["unit"]
    space = " " if unit == "ms" else ""
    head = f"- `{result['row']}`: {result['what']} {sign} {result['bound']:.3g}{space}{unit}:"
    interval = result["interval"]
    if interval is None:
        return f"{head} not measured"
    verdict = stats.target_verdict(interval["low"], interval["median"], interval["high"], result["bound"],
                                   at_least=result["at_least"])
    return f"{head} {stats.fmt(interval, 1 if unit == 'ms' else 2)}{space}{unit} — {verdict}"


# ---- report ----------------------------------------------------------------


def _statuses(counts: dict[str, Any]) -> str:
    statuses = counts["statuses"]
    other = sum(n for s, n in statuses.items() if s not in ("200", "503"))
    return f"{counts['sent']} / {statuses.get('200', 0)} / {statuses.get('503', 0)} / {other} / {counts['lost']}"


def _idle_line(result: dict[str, Any]) -> str:
    values = sorted(b["idle_cpu_per_s"][phase] for blocks in result["blocks"].values() for b in blocks
                    if "idle_cpu_per_s" in b for phase in PHASES)
    if not values:
        return "CPU of the servers not being measured: not recorded."
    return (f"CPU of the servers not being measured (idle servers paused; every process of their groups, "
            f"from /proc) during the measured phases: {stats.median_interval(values).median:.3f} CPU-s/s at the "
            f"median over {len(values)} phases, {values[-1]:.3f} at most.")


def markdown(result: dict[str, Any]) -> str:
    if result.get("skipped"):
        return f"# Mixed traffic, `{result['variant']}`\n\nNot run: {result['skipped']}\n"
    summary = result["summary"]
    rows = list(summary["rows"])
    coverage = stats.median_interval([0.0] * result["rounds"]).coverage
    small = SmallTraffic(**result["small"]).describe()
    lines = [
        f"# Mixed traffic, `{result['variant']}`",
        "",
        _common.start("meta"),
        _common.run_line(result),
        "",
        (f"{VARIANTS[result['variant']].description}. Small requests: {small}, alone and then with "
         f"{result['heavy_clients']} closed-loop heavy clients (after a {result['ramp_s']:g} s ramp); "
         f"{result['rounds']} round{'s' if result['rounds'] != 1 else ''} of {result['seconds']:g} s phases, rows "
         "in a fresh random order each round; every server stopped (SIGSTOP) while another row was measured. "
         f"Medians over rounds, [intervals] from order statistics (coverage {100 * coverage:.1f}% with "
         f"{result['rounds']} rounds). Run took {result['wall_s']:.0f} s, of which server start-up "
         f"{result['startup_s']:.0f} s."),
        _common.end("meta"),
        "",
        _common.start("tables"),
        "| row | " + " | ".join(label for label, _ in METRICS.values()) + " |",
        "|---|" + "---|" * len(METRICS),
    ]
    for row in rows:
        values = summary["rows"][row]["values"]
        cells = [stats.fmt(values.get(m), 1 if m.endswith("_ms") or m == "heavy_per_s" else 2) for m in METRICS]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines += [
        "",
        ("Requests, all rounds (sent / 200 / 503 / other status / lost: sent, never answered), and the small "
         "requests sent in each round (alone; flooded):"),
        "",
        "| row | small alone | small flooded | heavy | /health probes failed | small sent per round |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        counts, sent = summary["rows"][row]["counts"], summary["rows"][row]["small_sent"]
        lines.append(
            f"| {row} | {_statuses(counts['alone'])} | {_statuses(counts['flooded'])} | "
            f"{_statuses(counts['heavy'])} | {summary['rows'][row]['health_failures']} | "
            f"{' '.join(map(str, sent['alone']))}; {' '.join(map(str, sent['flooded']))} |"
        )
    unsent = {row: sum(summary["rows"][row]["counts"][phase]["unsent"] for phase in PHASES) for row in rows}
    if any(unsent.values()):
        lines += ["", "Small requests due and not sent (the in-flight bound was reached): "
                  + ", ".join(f"{row} {n}" for row, n in unsent.items())]
    lines += ["", _idle_line(result)]
    if summary["pairs"]:
        lines += [
            "",
            "Paired ratios, row / baseline per round (median [interval]):",
            "",
            "| row | baseline | " + " | ".join(METRICS[m][0] for m in PAIRED) + " |",
            "|---|---|" + "---|" * len(PAIRED),
        ]
        for pair in summary["pairs"]:
            ratio_cells = [f"{stats.fmt(pair['ratios'][m])}x" if pair["ratios"][m] else "–" for m in PAIRED]
            lines.append(f"| {pair['row']} | {pair['baseline']} | " + " | ".join(ratio_cells) + " |")
    errors = {
        row: {kind: b[kind]["first_error"] for b in result["blocks"][row] for kind in ("alone", "flooded", "heavy")
              if b[kind]["first_error"]}
        for row in rows
    }
    errors = {row: e for row, e in errors.items() if e}
    lines += ["", "Servers (model path and port vary):", ""]
    lines += [f"- {row}: `{result['servers'][row]['command']}`" for row in rows]
    if errors:
        lines += ["", f"First error of each kind: {json.dumps(errors)}"]
    lines += [
        _common.end("tables"),
        "",
        _common.start("targets"),
        *(verdict_line(t) for t in result["targets"]),
        _common.end("targets"),
    ]
    return "\n".join(lines) + "\n"


# ---- main ------------------------------------------------------------------


def _write(out: Path, result: dict[str, Any]) -> None:
    _common.write(out, f"mixed-{result['variant']}", result, markdown(result))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = _common.parser(__doc__ or "", "mixed", smoke=f"rows {' and '.join(SMOKE_ROWS)}, one round of 1.5 s phases")
    p.add_argument("--variant", choices=sorted(VARIANTS), default="preprocess")
    p.add_argument("--rows", nargs="+", choices=list(ROWS), help="default: every row")
    p.add_argument("--rounds", type=int, default=ROUNDS)
    p.add_argument("--seconds", type=float, default=SECONDS, help="length of each phase")
    p.add_argument("--small-rate", type=float, default=SMALL_RATE, help="small requests a second (Poisson)")
    p.add_argument("--heavy-clients", type=int, default=HEAVY_CLIENTS, help="closed-loop heavy clients")
    p.add_argument("--seed", type=int, default=0, help="the rows' order and the small requests' arrivals")
    args = p.parse_args(argv)
    if args.small_rate <= 0:
        p.error("--small-rate must be above 0")
    variant = VARIANTS[args.variant]
    traffic = SmallTraffic(args.small_rate, args.seed)
    if args.smoke:  # proves the whole run works in a few minutes; measures nothing
        rows, rounds, seconds, ramp_s, warmup_s = list(SMOKE_ROWS), 1, 1.5, 0.5, 0.5
    else:
        rows, rounds, seconds, ramp_s, warmup_s = args.rows or list(variant.rows), args.rounds, args.seconds, \
            RAMP_S, WARMUP_S
    if DEFAULT not in rows:
        rows = [DEFAULT, *rows]
    began = time.monotonic()
    result: dict[str, Any] = {
        "argv": argv, "command": _common.command("mixed", argv),
        "variant": args.variant, "machine": _common.machine(), "dirty": _common.dirty(),
        "loadavg_before": _common.loadavg(),
        "rounds": rounds, "seconds": seconds, "ramp_s": ramp_s, "heavy_clients": args.heavy_clients,
        "small": dataclasses.asdict(traffic),
        "servers": {row: {"command": dataclasses.replace(ROWS[row].config, extra_args=(*variant.server_args, *ROWS[row].config.extra_args)).shown()} for row in rows},
    }

    blocks: dict[str, list[dict[str, Any]]] = {row: [] for row in rows}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        try:
            model = variant.build_model(Path(tmp))
        except (ImportError, OSError, ValueError) as exc:
            if args.variant != "multimodal":
                raise
            return _skip(args.out, result, f"the tiny CLIP could not be built here ({type(exc).__name__}: {exc})")
        small = variant.small(str(model))()
        heavy = variant.heavy(str(model))
        started = time.monotonic()
        configs = {row: dataclasses.replace(ROWS[row].config,
                                            extra_args=(*variant.server_args, *ROWS[row].config.extra_args))
                   for row in rows}
        logs = {row: args.out / "logs" / f"mixed-{args.variant}-{row.replace(' ', '-')}.log" for row in rows}
        try:
            with progress.phase(f"starting {len(rows)} vLLM servers", 60 + 15 * len(rows)):
                running = stack.enter_context(
                    running_servers({row: c.for_smoke() if args.smoke else c for row, c in configs.items()}, model, logs)
                )
        except ServerFailed as exc:
            if args.variant != "multimodal":
                raise
            return _skip(args.out, result, f"a server did not start ({exc})")
        servers = {row: url + variant.path for row, (url, _) in running.items()}
        result["startup_s"] = time.monotonic() - started
        # Entered after the servers: every stopped one is resumed before they are stopped.
        idle = stack.enter_context(idle_servers.IdleServers(running))
        heavy_bodies = heavy()
        for row, url in servers.items():  # warm-up, not measured
            with idle.serving(row):
                mixed.run_for(url, small, 2, warmup_s)
                mixed.run_for(url, heavy_bodies, 2, warmup_s)
        for round_number, row, bar in progress.interleaved(rows, rounds, args.seed, f"mixed-{args.variant} blocks"):
            t0 = time.monotonic()
            with idle.serving(row):
                block = measure(servers[row], small, heavy, traffic, seconds, ramp_s, round_number,
                                functools.partial(idle.others_cpu, row), args.heavy_clients)
            block["wall_s"] = time.monotonic() - t0
            blocks[row].append(block)
            bar.note(f"round {round_number + 1} {row} ({block['wall_s']:.0f} s): p50 "
                     f"{block['alone']['p50_ms']:.1f} -> {block['flooded']['p50_ms']:.1f} ms; heavy "
                     f"{block['heavy']['requests_per_s']:.1f}/s; /health p99 {block['health']['p99_ms']:.1f} ms")
    result.update(
        loadavg_after=_common.loadavg(), wall_s=time.monotonic() - began, blocks=blocks, summary=summarize(blocks),
        targets=[evaluate(t, blocks) for t in targets(rows)],
    )
    _write(args.out, result)
    print(f"wrote the results into {args.out}")
    lost = sum(c["lost"] for r in result["summary"]["rows"].values() for c in r["counts"].values())
    if lost:
        print(f"{lost} requests were sent and never answered (must be 0): see the report", file=sys.stderr)
        return 1
    return 0


def _skip(out: Path, result: dict[str, Any], reason: str) -> int:
    print(f"{result['variant']} variant skipped: {reason}", file=sys.stderr)
    result["skipped"] = reason
    _write(out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
