"""The benchmarks page's decision table and pictures, made from the committed results.

Every figure comes from `benchmarks/results/latest/**` (the JSON the suites
wrote), so the table and the pictures cannot say something the results do
not. `make bench-snapshot` runs this after the suite it reruns;
`benchmarks/tests/test_plots.py` regenerates everything from the committed
results and checks it matches what is committed.

    python -m benchmarks plots                 # writes the files below
    python -m benchmarks plots --out DIR       # elsewhere (the test)

Writes `decision.md` (the table, between snippet markers) and `headlines.md`
(a headline table per suite that has no compact one of its own) into
benchmarks/results/latest/, and the pictures (`PICTURES`) into docs/img/.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness import common, stats

ROOT = Path(__file__).resolve().parents[2]

RESULTS = ROOT / "benchmarks" / "results" / "latest"
IMG = ROOT / "docs" / "img"
DEFAULT = "vLLM default"


def load(name: str, results: Path = RESULTS) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((results / name).read_text())
    return data


def fmt(interval: dict[str, float], digits: int = 2, unit: str = "x") -> str:
    """`median [low, high]unit`, the page's way of writing a figure."""
    return stats.fmt(interval, digits) + unit


def paired(name: str, row: str, metric: str, results: Path = RESULTS) -> dict[str, float]:
    """A `bench_paired` row's per-round ratio to vLLM default."""
    ratio: dict[str, float] = load(name, results)["summary"][row]["ratio"][metric]
    return ratio


def mixed_pair(variant: str, row: str, baseline: str, metric: str, results: Path = RESULTS) -> dict[str, float]:
    """A `bench_mixed` per-round ratio of `row` to `baseline`."""
    for pair in load(f"mixed/mixed-{variant}.json", results)["summary"]["pairs"]:
        if pair["row"] == row and pair["baseline"] == baseline:
            ratio: dict[str, float] = pair["ratios"][metric]
            return ratio
    raise KeyError(f"mixed-{variant}: no pair {row!r} / {baseline!r}")


def mixed_value(variant: str, row: str, metric: str, results: Path = RESULTS) -> dict[str, float]:
    value: dict[str, float] = load(f"mixed/mixed-{variant}.json", results)["summary"]["rows"][row]["values"][metric]
    return value


#: `{paired-batch process cpu:api}`: a paired run's per-round ratio to vLLM's default
#: (`paired/paired-batch.json`, row, metric); `{mixed score thread lanes flooded_p50_ms}`: a
#: mixed run's ratio of a row to vLLM's default (variant, row, metric).
_FIGURE = re.compile(r"\{(paired\S*|mixed \S+) (.+?) (\S+)\}")


def _figures(template: str, results: Path) -> str:
    def figure(m: re.Match[str]) -> str:
        run, row, metric = m.groups()
        if run.startswith("mixed "):
            return fmt(mixed_pair(run.split()[1], row, DEFAULT, metric, results))
        return fmt(paired(f"paired/{run}.json", row, metric, results))

    return _FIGURE.sub(figure, template)


def _ray(r: Path) -> str:
    data = load("ray/ray.json", r)
    ray = stats.median_interval(data["per_call_s"]["no-op"]["ray"])
    process = stats.median_interval(data["per_call_s"]["no-op"]["process"])
    over = stats.median_interval(data["ray_over_bare"]["no-op, ray / bare Ray actor, from a thread"])
    return (
        f"not measured against vLLM's default; what it costs, on one node: {ray.median * 1e6:.0f} µs a "
        f"call against {process.median * 1e6:.0f} µs for `process`, "
        f"{fmt(over.__dict__)} a bare Ray actor's"
    )


def _generate(r: Path) -> str:
    data = load("generate/generate.json", r)
    summary, top = data["summary"], max(data["rates"])

    def at(row: str, metric: str, rate: float = top) -> dict[str, float]:
        value: dict[str, float] = summary[f"mixed {rate:g}/s {row}"][metric]
        return value

    ratio = {row: fmt(at(f"offload {row}", "ttft_p99_ratio")) for row in ("process", "thread", "async-renderer")}
    return (
        f"nothing: at {top:g} chats/s (60% with an image) TTFT p99 {ratio['process']} (`process`), "
        f"{ratio['thread']} (`thread`), {ratio['async-renderer']} (`async-renderer`) vLLM's default's, whose own "
        f"renderer pool answers `/health` at p99 {fmt(at(DEFAULT, 'health_p99_ms'), unit=' ms')} with no timeouts "
        f"up to {top:g}/s; vLLM's `--api-server-count 2`: TTFT p99 {fmt(at('vLLM api-server-count 2', 'ttft_p99_ratio'))}"
    )


_MIXED_DETAILS = "#mixed-traffic-a-small-request-under-a-flood"
#: workload, what to use, what it buys against vLLM's default (`_figures`; a function: the ray
#: plugin's), where the run is described. One recommendation, the same as the README's, the
#: index's and the vLLM guide's: `thread` for most workloads (none for one short text a request,
#: where offload's own work costs more than it moves off); `process` when preprocessing holds
#: the GIL and `/health` must stay fast; `inline` only as the baseline when measuring;
#: `async-renderer` only for a function with a cheaper batch form.
DECISIONS: tuple[tuple[str, str, str | Callable[[Path], str], str], ...] = (
    ("Short texts, one prompt a request",
     ("vLLM's default, no strategy: offload's own work a request on the loop costs more than it moves off; "
      "for more requests/s, vLLM's `--api-server-count 2`"),
     ("a cost: API-server CPU per request {paired thread cpu:api} (`thread`), {paired process cpu:api} "
     "(`process`), {paired async-renderer cpu:api} (`async-renderer`); requests/s {paired thread requests_per_s} "
     "(`thread`); with `--api-server-count 2`, `thread`'s requests/s {paired thread api-server-count 2 requests_per_s} "
     "against vLLM's {paired vLLM api-server-count 2 requests_per_s}"),
     "#paired-cpu-per-request"),
    ("Many prompts a request", "`process` (the adapter renders a request's prompts in one call per worker)",
     ("API-server CPU per request {paired-batch process cpu:api}, projected ceiling of one API server "
     "{paired-batch process ceiling}"),
     "decisions/0008-one-render-call-per-worker.md"),
    ("Heavy preprocessing, `/health` must stay fast", "`process` (workers at `nice` 10, the default)",
     ("`/health` p99 {paired-batch-loop process health_p99_ms} at requests/s {paired-batch-loop process requests_per_s}; "
     "`thread` does not: {paired-batch-loop thread health_p99_ms}"),
     "decisions/0001-workers-below-the-loop-nice-10.md"),
    ("Long texts truncated to a few tokens (`truncate_prompt_tokens`)",
     "`thread` (the default; prefix tokenization is on by default)",
     ("requests/s {paired-truncated thread requests_per_s} (`thread`), {paired-truncated async-renderer requests_per_s} "
     "(`async-renderer`); `thread` with prefix tokenization off: {paired-truncated thread no prefix requests_per_s}; "
     "the price: `/health` p99 {paired-truncated thread health_p99_ms} (`thread`) at five times the requests/s"),
     "decisions/0006-prefix-tokenization-on-by-default.md"),
    ("Long texts truncated, mixed small and heavy traffic",
     "`thread` (the default; lanes need no setting); `process` when `/health` must stay fast",
     ("small request's p50 under a flood {mixed preprocess process lanes flooded_p50_ms} (`process`), "
     "{mixed preprocess thread lanes flooded_p50_ms} (`thread`); heavy requests/s "
     "{mixed preprocess process lanes heavy_per_s} (`process`), {mixed preprocess thread lanes heavy_per_s} (`thread`)"),
     _MIXED_DETAILS),
    ("Small and large `/score` requests", "`thread` (the default)",
     ("small `/score` p50 under a flood {mixed score thread lanes flooded_p50_ms}, p99 "
     "{mixed score thread lanes flooded_p99_ms}; heavy requests/s {mixed score thread lanes heavy_per_s}"),
     _MIXED_DETAILS),
    ("Heavy requests that the engine, not preprocessing, spends its time on",
     "`thread` (the default); vLLM's own is as good: lanes help only the preprocessing part",
     ("little: small p50 under a flood {mixed engine process lanes flooded_p50_ms}, heavy requests/s "
     "{mixed engine process lanes heavy_per_s} (offload does not schedule the engine)"),
     _MIXED_DETAILS),
    ("Images", "`process`, with `--mm-processor-cache-gb 0`",
     ("small image request's p50 under a flood {mixed multimodal thread lanes flooded_p50_ms} (`thread`), "
     "{mixed multimodal process lanes flooded_p50_ms} (`process`, at heavy requests/s "
     "{mixed multimodal process lanes heavy_per_s}); `/health` p99 under it "
     "{mixed multimodal process lanes health_p99_ms} (`process`), {mixed multimodal thread lanes health_p99_ms} "
     "(`thread`)"),
     "decisions/0028-the-concurrency-sweep-answered-once.md"),
    ("Chat with images (`/v1/chat/completions`, vLLM 0.32)",
     "vLLM's default, or its `--api-server-count 2`; no strategy", _generate, "generate.md#which-strategy"),
    ("A function with a cheaper batch form", "`async-renderer`, only there",
     ("on vLLM's pooling endpoints, short texts: less than `thread` costs, no less than vLLM's default: "
     "API-server CPU per request {paired async-renderer cpu:api} (`async-renderer`), {paired thread cpu:api} (`thread`)"),
     "strategies/async-renderer.md"),
    ("Beyond one machine", "the `ray` plugin (`pip install offload-ray`, `--offload-strategy ray`)", _ray,
     "ray.md#cost"),
)


def decision_table(results: Path = RESULTS) -> str:
    lines = [
        common.start("table"),
        "| workload | use | what it buys against vLLM's default (median [interval], ratio per round) | run |",
        "|---|---|---|---|",
    ]
    lines += [f"| {workload} | {use} | {buys(results) if callable(buys) else _figures(buys, results)} | [details]({link}) |"
              for workload, use, buys, link in DECISIONS]
    lines.append(common.end("table"))
    return "\n".join(lines) + "\n"


# ---- headline tables ---------------------------------------------------------

PAIRED_HEADLINE = ("inline", "thread", "process", "async-renderer")
PAIRED_METRICS = {
    "cpu:loop": "loop-thread CPU / request",
    "cpu:api": "API-server CPU / request",
    "cpu:total": "total CPU / request",
    "requests_per_s": "requests/s",
    "ceiling": "projected ceiling of one API server",
}
MIXED_HEADLINE_ROWS = ("thread lanes", "process lanes")
#: variant -> what its heavy request is
MIXED_HEADLINE = {
    "preprocess": "16 texts of 1500 words, truncated to 32 tokens",
    "token-ids": "16 lists of 512 token ids",
    "score": "`/score`, 32 documents of 750 words",
    "engine": "16 texts of 150 words (the engine's work)",
    "multimodal": "4 images of 1024 pixels",
}


def paired_headline(results: Path = RESULTS) -> str:
    """`paired`'s answer: each strategy's ratios to vLLM's default, per round."""
    summary = load("paired/paired.json", results)["summary"]
    rows = [r for r in PAIRED_HEADLINE if r in summary]
    lines = ["| ratio to vLLM's default (per round) | " + " | ".join(f"`{r}`" for r in rows) + " |",
             "|---|" + "---|" * len(rows)]
    lines += [f"| {label} | " + " | ".join(fmt(summary[r]["ratio"][m]) for r in rows) + " |"
              for m, label in PAIRED_METRICS.items()]
    return "\n".join(lines) + "\n"


def mixed_headline(results: Path = RESULTS) -> str:
    """`mixed`'s answer per variant: a small request's p50 under the flood against its
    time alone, and against vLLM's default; heavy requests/s against vLLM's default."""
    lines = [
        ("| heavy request | row | small p50 flooded / alone | small p50 flooded, vs vLLM default | "
         "heavy requests/s, vs vLLM default |"),
        "|---|---|---|---|---|",
    ]
    for variant, heavy in MIXED_HEADLINE.items():
        default = mixed_value(variant, DEFAULT, "p50_ratio", results)
        lines.append(f"| {heavy} | vLLM default | {fmt(default)} | | |")
        lines.extend(
            f"| | `{row.split()[0]}`, lanes | {fmt(mixed_value(variant, row, 'p50_ratio', results))} | "
            f"{fmt(mixed_pair(variant, row, DEFAULT, 'flooded_p50_ms', results))} | "
            f"{fmt(mixed_pair(variant, row, DEFAULT, 'heavy_per_s', results))} |"
            for row in MIXED_HEADLINE_ROWS
        )
    return "\n".join(lines) + "\n"


#: Section of `headlines.md` -> how it is made.
HEADLINES: dict[str, Callable[[Path], str]] = {"paired": paired_headline, "mixed": mixed_headline}


def headlines(results: Path = RESULTS) -> str:
    return "".join(
        f"{common.start(name)}\n{make(results)}{common.end(name)}\n"
        for name, make in HEADLINES.items()
    )


# ---- pictures -----------------------------------------------------------------

MIXED_ROWS = ("vLLM default", "thread fifo", "thread lanes", "process fifo", "process lanes")
#: variant -> its label on the picture
MIXED_VARIANTS = {
    "preprocess": "long texts, truncated",
    "score": "/score, many documents",
    "multimodal": "images",
    "engine": "engine-bound texts",
}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Same input, same SVG: no random ids, no date.
    plt.rcParams["svg.hashsalt"] = "offload"
    plt.rcParams["svg.fonttype"] = "none"
    return plt


def _errors(intervals: list[dict[str, float]]) -> list[list[float]]:
    return [[i["median"] - i["low"] for i in intervals], [i["high"] - i["median"] for i in intervals]]


def small_under_flood(path: Path, results: Path = RESULTS) -> None:
    """Small-request p50 under a flood, per row and variant (log scale), with intervals."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.6))
    width = 0.8 / len(MIXED_ROWS)
    for k, row in enumerate(MIXED_ROWS):
        # A variant's latest run may leave a row out (images: four servers fit in memory at once).
        shown = [(i, v) for i, v in enumerate(MIXED_VARIANTS)
                 if row in load(f"mixed/mixed-{v}.json", results)["summary"]["rows"]]
        values = [mixed_value(v, row, "flooded_p50_ms", results) for _, v in shown]
        xs = [i + (k - (len(MIXED_ROWS) - 1) / 2) * width for i, _ in shown]
        ax.bar(xs, [v["median"] for v in values], width, yerr=_errors(values), capsize=2, label=row)
    alone = [mixed_value(v, DEFAULT, "alone_p50_ms", results)["median"] for v in MIXED_VARIANTS]
    ax.scatter(range(len(MIXED_VARIANTS)), alone, marker="_", s=600, color="black", zorder=3,
               label="vLLM default, no flood")
    ax.set_yscale("log")
    ax.set_xticks(range(len(MIXED_VARIANTS)), list(MIXED_VARIANTS.values()))
    ax.set_ylabel("small request p50 (ms)")
    ax.set_title("A small request under a flood of heavy ones\n(python -m benchmarks mixed)")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)


API_ROWS = ("inline", "thread", "process", "async-renderer")


def api_cpu(path: Path, results: Path = RESULTS) -> None:
    """API-server process CPU per request, ratio to vLLM default, one prompt and 32 prompts a request."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.2))
    runs = (("one 160-word text a request", "paired/paired.json"), ("32 texts a request", "paired/paired-batch.json"))
    width = 0.8 / len(runs)
    for k, (label, name) in enumerate(runs):
        summary = load(name, results)["summary"]
        rows = [r for r in API_ROWS if r in summary]
        values = [summary[r]["ratio"]["cpu:api"] for r in rows]
        xs = [API_ROWS.index(r) + (k - (len(runs) - 1) / 2) * width for r in rows]
        ax.bar(xs, [v["median"] for v in values], width, yerr=_errors(values), capsize=3, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(API_ROWS)), API_ROWS)
    ax.set_ylabel("API-server CPU / request\n(ratio to vLLM default)")
    ax.set_title("API-server CPU per request, ratio to vLLM's default\n(python -m benchmarks paired; below 1: less than vLLM's default)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)


FAIRNESS_ROWS = (
    "lanes 4:1 | thread, 1 worker | fair",
    "lanes 4:1 | process, 2 workers | fair",
    "lanes 4:1 | thread, 1 worker | fifo",
    "lanes 4:1 | process, 2 workers | fifo",
)


def fairness(path: Path, results: Path = RESULTS) -> None:
    """One run's weighted served-cost gap between two backlogged lanes (4:1), piece by piece."""
    plt = _pyplot()
    data = load("fairness/fairness.json", results)
    piece = max(data["max_cost"][c] / w for c, w in data["results"][FAIRNESS_ROWS[0]]["weights"].items())
    fig, ax = plt.subplots(figsize=(8, 3.2))
    for key in FAIRNESS_ROWS:
        trace = data["results"][key]["trace"]
        _, executor, scheduling = key.split(" | ")
        label = f"{executor}, {'fair (lanes)' if scheduling == 'fair' else 'first come, first served'}"
        ax.plot(range(len(trace)), [g / piece for g in trace], label=label, linewidth=1)
    ax.set_yscale("symlog", linthresh=2)
    ax.axhspan(-1, 1, color="grey", alpha=0.2, linewidth=0)
    ax.set_xlabel("calls started")
    ax.set_ylabel("weighted served cost,\na minus b (pieces)")
    ax.set_title("Two backlogged lanes, weights 4:1\n(python -m benchmarks fairness; grey: within one piece)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)


#: The pictures: file name -> how it is drawn.
PICTURES: dict[str, Callable[[Path, Path], None]] = {
    "small_under_flood.svg": small_under_flood,
    "api_cpu.svg": api_cpu,
    "fairness.svg": fairness,
}


def write(out: Path, img: Path, results: Path = RESULTS) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    img.mkdir(parents=True, exist_ok=True)
    table = out / "decision.md"
    table.write_text(decision_table(results))
    (out / "headlines.md").write_text(headlines(results))
    written = [table, out / "headlines.md"]
    for name, draw in PICTURES.items():
        draw(img / name, results)
        written.append(img / name)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=RESULTS, help="where the results are read from")
    p.add_argument("--out", type=Path, help="write everything here instead (table and pictures)")
    args = p.parse_args(argv)
    out = args.out or RESULTS
    img = args.out or IMG
    for path in write(out, img, args.results):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
