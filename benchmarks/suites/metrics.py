"""What the `offload_*` metrics cost per call: one `Call` admitted, started and
finished through an executor's tracker, with metrics on and off, interleaved.

    python -m benchmarks metrics            # 7 rounds of 50,000 calls
    python -m benchmarks metrics --smoke --out DIR

Prints microseconds per call (best and median of the rounds) for each mode and
the difference; writes metrics.json into --out (default .benchmarks/runs/metrics/).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import common as _common
from benchmarks.harness import progress
from offload._bounds import Limits
from offload._call import Call
from offload._lanes import Lanes
from offload._tracker import CallTracker

ROOT = Path(__file__).resolve().parents[2]

def _identity(x: int) -> int:
    return x


def per_call_us(metrics: bool, n: int) -> float:
    lanes = Lanes()
    tracker = CallTracker("thread", lanes, Limits(2, None, None), metrics=metrics)
    start = time.perf_counter()
    for i in range(n):
        call: Call[int] = Call(_identity, (i,), {})
        call.lane = lanes.default
        tracker.admit(call)
        call.claim()
        call.set_result(i)
    return (time.perf_counter() - start) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", type=Path, default=_common.RESULTS / "metrics")
    args = p.parse_args(argv)
    rounds, n = (2, 2000) if args.smoke else (7, 50_000)
    results: dict[str, list[float]] = {"on": [], "off": []}
    with progress.Progress(rounds, "metrics rounds") as bar:
        for r in range(rounds):
            for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
                results[mode].append(per_call_us(mode == "on", n))
            bar.step()
    summary: dict[str, Any] = {
        mode: {"best_us": min(v), "median_us": statistics.median(v), "rounds": v} for mode, v in results.items()
    }
    summary["added_us_median"] = summary["on"]["median_us"] - summary["off"]["median_us"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "metrics.json").write_text(json.dumps(summary, indent=2))
    for mode in ("on", "off"):
        print(f"metrics {mode}: best {min(results[mode]):.2f} us/call, median {statistics.median(results[mode]):.2f} us/call")
    print(f"added by metrics (medians): {statistics.median(results['on']) - statistics.median(results['off']):.2f} us/call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
