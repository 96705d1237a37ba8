"""Regression check: the steady figures of the current tree against the docs' snapshot (`results/latest`).

    python -m benchmarks compare                        # overhead (~1 min) and CPU per request (~8 min)
    python -m benchmarks compare --skip-paired          # overhead only
    python -m benchmarks compare --paired-result FILE   # a paired.json already made, instead of a rerun
    python -m benchmarks compare --smoke                # tiny overhead run, no vLLM: proves it runs

It reruns the figures that hold still from run to run on one machine: the
per-call overhead (`overhead`: microseconds a call, and each contender's ratio
to `run_in_executor` within a round) and the API server's CPU per request
(`paired`: loop-thread and whole-process CPU a request, absolute and as a
ratio to vLLM's default within a round). For each it gives the latest
committed result and this run as medians with distribution-free intervals
(`harness/stats.py`), and calls a figure *moved* only where the two
intervals do not overlap: on a noisy machine that is the most a few rounds
can say. A latest result kept as medians only is a point, moved from where
this run's interval leaves it out. Absolute figures compare only on the machine that made
`results/latest` (the check says when the machine differs); the ratios carry
better. Nothing is written unless `--out` names a file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import common, stats

#: The paired rows rerun by default: the two strategies with a pool (and vLLM's default, always).
PAIRED_ROWS = ("thread", "process")
#: Per-request CPU parts compared, `paired`'s names -> what the table says.
PAIRED_PARTS = {"loop": "loop-thread CPU ms/request", "api": "API-server CPU ms/request"}
#: The overhead contenders compared with `run_in_executor` within each round.
OVERHEAD_RATIOS = ("offload inline", "offload thread")


@dataclass(frozen=True)
class Figure:
    """One figure, latest committed against now; lower is better for all of them."""

    name: str
    latest: stats.Interval
    now: stats.Interval

    @property
    def verdict(self) -> str:
        if self.now.low > self.latest.high:
            return "**moved: higher** (worse)"
        if self.now.high < self.latest.low:
            return "**moved: lower** (better)"
        return "within the noise"

    @property
    def moved(self) -> bool:
        return self.verdict != "within the noise"


def _point(value: float) -> stats.Interval:
    """A result kept as a median only: an interval of one point."""
    return stats.Interval(value, value, value, coverage=0.0, n=1)


def overhead_figures(latest: dict[str, Any], now: dict[str, dict[str, list[float]]]) -> list[Figure]:
    """`overhead`'s seconds a call and ratios to `run_in_executor`, latest against now: per
    round where the latest result kept its rounds (`rounds_seconds_per_call`), else its medians as points."""
    figures = []
    for workload, contenders in now.items():
        rounds = latest.get("rounds_seconds_per_call", {}).get(workload)
        medians = latest.get("seconds_per_call", {}).get(workload, {})
        for name, values in contenders.items():
            if name not in (rounds or medians):
                continue
            then = stats.median_interval([s * 1e6 for s in rounds[name]]) if rounds else _point(medians[name] * 1e6)
            figures.append(Figure(f"overhead, {workload}: {name} (µs/call)", then,
                                  stats.median_interval([s * 1e6 for s in values])))
            if name in OVERHEAD_RATIOS:
                then = (stats.median_interval(stats.paired_ratios(rounds[name], rounds["run_in_executor"])) if rounds
                        else _point(medians[name] / medians["run_in_executor"]))
                figures.append(Figure(f"overhead, {workload}: {name} / run_in_executor (per round)", then,
                                      stats.median_interval(stats.paired_ratios(values, contenders["run_in_executor"]))))
    return figures


def _cpu(blocks: list[dict[str, Any]], part: str) -> list[float]:
    return [float(b["cpu_ms_per_request"][part]) for b in blocks]


def paired_figures(latest: dict[str, Any], now: dict[str, Any]) -> list[Figure]:
    """`paired`'s CPU per request, per row both runs have: absolute, and per-round ratios to vLLM's default."""
    from benchmarks.suites.paired import DEFAULT

    figures = []
    for row in (r for r in now["blocks"] if r in latest["blocks"]):
        for part, label in PAIRED_PARTS.items():
            figures.append(Figure(f"paired, {row}: {label}",
                                  stats.median_interval(_cpu(latest["blocks"][row], part)), stats.median_interval(_cpu(now["blocks"][row], part))))
            if row != DEFAULT:
                figures.append(Figure(
                    f"paired, {row}: {label} / vLLM default's (per round)",
                    stats.median_interval(stats.paired_ratios(_cpu(latest["blocks"][row], part), _cpu(latest["blocks"][DEFAULT], part))),
                    stats.median_interval(stats.paired_ratios(_cpu(now["blocks"][row], part), _cpu(now["blocks"][DEFAULT], part))),
                ))
    return figures


def _fmt(interval: stats.Interval) -> str:
    digits = 3 if interval.median < 10 else 1
    if interval.n == 1:
        return f"{interval.median:.{digits}f} (median only)"
    return f"{interval.median:.{digits}f} [{interval.low:.{digits}f}, {interval.high:.{digits}f}]"


def report(figures: list[Figure], notes: list[str]) -> str:
    """The answer first (what moved), then every figure."""
    moved = [f for f in figures if f.moved]
    head = (f"{len(moved)} of {len(figures)} figures moved beyond the noise: "
            + "; ".join(f"{f.name} {f.verdict.replace('**', '')}" for f in moved)
            if moved else f"Nothing moved beyond the noise ({len(figures)} figures).")
    lines = [head, "", *notes, *([""] if notes else []),
             "| figure | results/latest | now | now / latest | verdict |", "|---|---|---|---|---|"]
    for f in figures:
        ratio = f.now.median / f.latest.median if f.latest.median else float("nan")
        lines.append(f"| {f.name} | {_fmt(f.latest)} | {_fmt(f.now)} | {ratio:.2f}x | {f.verdict} |")
    return "\n".join(lines) + "\n"


def _same_machine(what: str, then: str, now: str) -> list[str]:
    if then == now:
        return []
    return [(f"- {what}: results/latest was made on {then}, this run on {now}: compare the ratios, "
             "not the absolute figures.")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny overhead run, no paired rerun: proves it runs")
    p.add_argument("--baseline", type=Path, default=common.SNAPSHOT, help="results to compare against (default: the snapshot)")
    p.add_argument("--skip-paired", action="store_true", help="compare the overhead figures only")
    p.add_argument("--paired-result", type=Path, help="a paired.json made on this tree, instead of a rerun")
    p.add_argument("--rows", nargs="+", default=list(PAIRED_ROWS), help="paired rows to rerun (vLLM default always)")
    p.add_argument("--rounds", type=int, default=4, help="paired rounds")
    p.add_argument("--seconds", type=float, default=8.0, help="paired block length")
    p.add_argument("--out", type=Path, help="also write the comparison (markdown) here")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)

    from benchmarks.suites import overhead

    figures: list[Figure] = []
    notes: list[str] = []
    latest_overhead = json.loads((args.baseline / "overhead" / "overhead.json").read_text())
    here = common.machine()
    notes += _same_machine("overhead", f"{latest_overhead['machine']['cpus']} CPUs, {latest_overhead['machine']['platform']}",
                           f"{here['cpus']} CPUs, {here['platform']}")
    if not latest_overhead.get("rounds_seconds_per_call"):
        notes.append("- overhead: results/latest kept its medians only (a run from before the rounds were "
                     "kept), shown as a point: a figure moved where this run's interval leaves it out. "
                     "`python -m benchmarks overhead` on a quiet machine makes a baseline with rounds.")
    _, rounds = asyncio.run(overhead.measure(args.smoke))
    figures += overhead_figures(latest_overhead, rounds)
    notes.append(f"- load average now: {' / '.join(f'{x:.1f}' for x in os.getloadavg())} (1, 5, 15 min); "
                 f"when results/latest/overhead was made: {latest_overhead['machine'].get('loadavg', 'not recorded')}.")

    if not (args.smoke or args.skip_paired):
        latest_paired = json.loads((args.baseline / "paired" / "paired.json").read_text())
        if args.paired_result:
            now_paired = json.loads(args.paired_result.read_text())
        else:
            from benchmarks.suites import paired

            with tempfile.TemporaryDirectory() as tmp:
                status = paired.main(["--rows", *args.rows, "--rounds", str(args.rounds),
                                      "--seconds", str(args.seconds), "--out", tmp])
                if status:
                    return status
                now_paired = json.loads((Path(tmp) / "paired.json").read_text())
        notes += _same_machine("paired", latest_paired["machine"],
                               common.machine_words())
        figures += paired_figures(latest_paired, now_paired)
    elif args.smoke:
        notes.append("- smoke run: tiny overhead rounds, no paired rerun; the verdicts mean nothing.")

    text = report(figures, notes)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0
