"""Fairness at library level, measured as the fair-serving literature reports it.

Two backlogged clients share an executor's workers: two lanes (weights 4:1
and 1:1), or two flows in one lane. Each client's calls are one flow (an
`admission()` block) of random costs, client `a` from 1 to 10 and client `b`
from 1 to 40, and the work of a call is a sleep of `cost` units (0.25 ms by
default), so the order the queue chooses, not the machine's load, decides
what is served. Every call is queued before any can start (the workers are
held by a short first call), in a random interleaved order; the run stops
being measured when one client has no call left to start (its last call
started), and the other client's queued calls are then cancelled.

Served cost is counted by the calls' declared costs, in the order they
started (each call records when it starts; `time.monotonic` is one clock for
every process on Linux), not by wall time. Per run:

- **largest gap**: the largest difference in weighted served cost (cost /
  weight) between the two clients over any interval of the measured window
  (max minus min of `served_a / w_a - served_b / w_b`), in units of the
  largest piece (the largest `cost / weight` of either client). Virtual
  Token Counter (Sheng et al., OSDI '24) bounds it by about 2 for one worker;
  first come, first served has no bound (it grows with the backlog).
- **weighted share ratio**: `(served_a / w_a) / (served_b / w_b)` over the
  window: 1 is a fair share; the target is within 10% of 1.

Each configuration (scenario x executor x scheduling) runs `--repeats` times
with fresh random costs and order; the report gives medians with
distribution-free intervals (`benchmarks/harness/stats.py`). First come, first
served is `scheduling="fifo"` on the same executor: the reference.

    python -m benchmarks fairness                 # make bench-fairness (~5 min on 2 cores)
    python -m benchmarks fairness --repeats 3 --unit-ms 1
    python -m benchmarks fairness --smoke --out DIR

Writes fairness.json and fairness.md into --out (default
.benchmarks/runs/fairness/).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import functools
import importlib
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import offload
from benchmarks.harness import common as _common
from benchmarks.harness import progress, stats

#: Each client's costs: uniform integers from 1 to this.
MAX_COST = {"a": 10, "b": 40}
#: Calls each client queues per run: enough that the measured window's
#: weighted cost is many times the largest piece, so that a share can be read
#: to within a few percent (the gap, about a piece, is divided by it).
CALLS = 400
REPEATS = 5
#: How long a first call holds each worker while the clients' calls are queued.
GATE_S = 0.3


@dataclass(frozen=True)
class Scenario:
    name: str
    #: Lane weights, or None: both clients are flows of the default lane (weight 1).
    lanes: dict[str, float] | None
    #: False: a fresh executor for every run (both clients start level). True:
    #: one executor for all runs, after one unmeasured run, so each measured
    #: run starts with lanes that were idle since the previous one ended, one
    #: of them left ahead of the other in served cost (at most about a piece).
    reused: bool = False


SCENARIOS = (
    Scenario("lanes 4:1", {"a": 4.0, "b": 1.0}),
    Scenario("lanes 1:1", {"a": 1.0, "b": 1.0}),
    Scenario("flows, one lane", None),
    Scenario("lanes 4:1, after idle", {"a": 4.0, "b": 1.0}, reused=True),
)
#: name -> (strategy, workers)
EXECUTORS = {"thread, 1 worker": ("thread", 1), "thread, 2 workers": ("thread", 2), "process, 2 workers": ("process", 2)}


def work(cost: float, unit_s: float) -> tuple[float, float]:
    """The call: `cost` units of sleep; returns when it started and ended."""
    start = time.monotonic()
    time.sleep(cost * unit_s)
    return start, time.monotonic()


def _work() -> Callable[[float, float], tuple[float, float]]:
    # Process workers must find the function by its module's name, which is
    # `__main__` under `python -m`: take it from the importable module.
    module = importlib.import_module("benchmarks.suites.fairness")
    fn: Callable[[float, float], tuple[float, float]] = module.work
    return fn


def run_once(
    executor: offload.Executor,
    scenario: Scenario,
    rng: random.Random,
    calls: int,
    unit_s: float,
    workers: int,
    gate_s: float = GATE_S,
) -> dict[str, Any]:
    """One run: both clients' calls queued, measured until one has none left to start."""
    fn = _work()
    weights = scenario.lanes or {"a": 1.0, "b": 1.0}
    costs = {c: [rng.randint(1, MAX_COST[c]) for _ in range(calls)] for c in ("a", "b")}
    order = ["a"] * calls + ["b"] * calls
    rng.shuffle(order)
    contexts: dict[str, contextvars.Context] = {}
    blocks: dict[str, contextlib.AbstractContextManager[Any]] = {}
    for client in ("a", "b"):
        # One flow per client: an admission block entered in a context of its own,
        # so that both stay open while the calls are submitted interleaved.
        ctx = contextvars.copy_context()
        lane = client if scenario.lanes else None
        block = executor.admission(f"client-{client}", cost=sum(costs[client]), lane=lane, refuse=False)
        ctx.run(block.__enter__)
        contexts[client], blocks[client] = ctx, block
    gates = [executor.submit(time.sleep, gate_s) for _ in range(workers)]
    futures: dict[str, list[concurrent.futures.Future[tuple[float, float]]]] = {"a": [], "b": []}
    left = {"a": calls, "b": calls}
    lock = threading.Lock()
    one_done = threading.Event()

    def finished(client: str) -> Callable[[concurrent.futures.Future[Any]], None]:
        def callback(_: concurrent.futures.Future[Any]) -> None:
            with lock:
                left[client] -= 1
                if left[client] == 0:
                    one_done.set()

        return callback

    taken = {"a": 0, "b": 0}
    for client in order:
        cost = costs[client][taken[client]]
        taken[client] += 1
        future = contexts[client].run(executor.options(cost=cost).submit, fn, cost, unit_s)
        future.add_done_callback(finished(client))
        futures[client].append(future)
    for client in ("a", "b"):
        contexts[client].run(blocks[client].__exit__, None, None, None)
    one_done.wait()
    for fs in futures.values():
        for f in fs:
            f.cancel()
    concurrent.futures.wait(gates + futures["a"] + futures["b"])
    events = []  # (start, client, cost)
    for client, fs in futures.items():
        for cost, f in zip(costs[client], fs, strict=True):
            if not f.cancelled():
                events.append((f.result()[0], client, cost))
    events.sort()
    return measure(events, weights, calls)


def measure(events: list[tuple[float, str, float]], weights: dict[str, float], calls: int) -> dict[str, Any]:
    """Served cost by start order, over the window in which both clients were backlogged."""
    started = {"a": 0, "b": 0}
    end = len(events)
    for i, (_, client, _) in enumerate(events):
        started[client] += 1
        if started[client] == calls:  # this client's last call: it is no longer backlogged
            end = i + 1
            break
    served = {"a": 0.0, "b": 0.0}
    gap = [0.0]
    for _, client, cost in events[:end]:
        served[client] += cost
        gap.append(served["a"] / weights["a"] - served["b"] / weights["b"])
    piece = max(MAX_COST[c] / weights[c] for c in ("a", "b"))
    weighted = {c: served[c] / weights[c] for c in ("a", "b")}
    return {
        "pieces": end,
        "served": served,
        "largest_gap": max(gap) - min(gap),
        "largest_gap_pieces": (max(gap) - min(gap)) / piece,
        "share_ratio": weighted["a"] / weighted["b"] if weighted["b"] else float("inf"),
        "trace": [round(g, 1) for g in gap],
    }


def _executor(strategy: str, workers: int, lanes: dict[str, float] | None, scheduling: str) -> offload.Executor:
    executor = offload.get_executor(strategy, max_workers=workers, lanes=lanes, scheduling=scheduling)
    executor.start()
    return executor


def bench(
    calls: int,
    repeats: int,
    unit_s: float,
    seed: int,
    executors: dict[str, tuple[str, int]],
    gate_s: float = GATE_S,
) -> dict[str, Any]:
    rng = random.Random(seed)
    results: dict[str, Any] = {}
    bar = progress.Progress(len(SCENARIOS) * len(executors) * 2, "fairness rows")
    for scenario in SCENARIOS:
        for label, (strategy, workers) in executors.items():
            for scheduling in ("fair", "fifo"):
                executor = functools.partial(_executor, strategy, workers, scenario.lanes, scheduling)
                runs = []
                if scenario.reused:
                    with executor() as shared:
                        run_once(shared, scenario, rng, calls, unit_s, workers, gate_s)  # leaves the lanes uneven
                        runs = [run_once(shared, scenario, rng, calls, unit_s, workers, gate_s) for _ in range(repeats)]
                else:
                    for _ in range(repeats):
                        with executor() as fresh:
                            runs.append(run_once(fresh, scenario, rng, calls, unit_s, workers, gate_s))
                key = f"{scenario.name} | {label} | {scheduling}"
                results[key] = {
                    "scenario": scenario.name, "executor": label, "scheduling": scheduling,
                    "weights": scenario.lanes or {"a": 1.0, "b": 1.0},
                    "runs": [{k: v for k, v in r.items() if k != "trace"} for r in runs],
                    # One run's weighted gap after each piece, for the picture (benchmarks/plots.py).
                    "trace": runs[0]["trace"] if scenario is SCENARIOS[0] else None,
                    "largest_gap_pieces": _interval([r["largest_gap_pieces"] for r in runs]),
                    "share_ratio": _interval([r["share_ratio"] for r in runs]),
                }
                bar.step(key)
                bar.note(f"{key}: gap {results[key]['largest_gap_pieces']['median']:.2f} pieces, "
                         f"share ratio {results[key]['share_ratio']['median']:.2f}")
    bar.close()
    return results


def _interval(values: list[float]) -> dict[str, float]:
    return stats.median_interval(values).__dict__


_fmt = stats.fmt


def within(interval: dict[str, float], tolerance: float = 0.1) -> bool:
    """The weighted share's median within `tolerance` of a fair share."""
    return abs(interval["median"] - 1) <= tolerance


def markdown(data: dict[str, Any]) -> str:
    info = data["machine"]
    lines = [
        "# Fairness: two backlogged clients (library level)",
        "",
        _common.start("meta"),
        (f"Measured {info['date']} on {info['cpus']} CPUs, Python {info['python']}, commit "
        f"`{info['commit'] or 'uncommitted'}`; {data['calls']} calls per client per run, "
        f"{data['repeats']} runs per row, work = {data['unit_ms']:g} ms of sleep per unit of cost; "
        f"client `a` costs 1-{MAX_COST['a']}, `b` 1-{MAX_COST['b']}. "
        f"Medians over runs with [interval] ({data['coverage']:.1%} coverage)."),
        _common.end("meta"),
        "",
        _common.start("table"),
        ("| clients | executor | largest gap, fair (pieces) | largest gap, FIFO (pieces) "
        "| weighted share a/b, fair | within 10% | weighted share a/b, FIFO |"),
        "|---|---|---|---|---|---|---|",
    ]
    rows = data["results"]
    for scenario in SCENARIOS:
        for label in data["executors"]:
            fair = rows[f"{scenario.name} | {label} | fair"]
            fifo = rows[f"{scenario.name} | {label} | fifo"]
            lines.append(
                f"| {scenario.name} | {label} | {_fmt(fair['largest_gap_pieces'])} "
                f"| {_fmt(fifo['largest_gap_pieces'])} | {_fmt(fair['share_ratio'])} "
                f"| {'yes' if within(fair['share_ratio']) else '**no**'} | {_fmt(fifo['share_ratio'])} |"
            )
    lines += [_common.end("table"), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = _common.parser("Fairness of lanes and flows between two backlogged clients (no vLLM)", "fairness")
    p.add_argument("--repeats", type=int, default=REPEATS)
    p.add_argument("--calls", type=int, default=CALLS, help="calls each client queues per run")
    p.add_argument("--unit-ms", type=float, default=0.25, help="sleep per unit of cost")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    gate_s = GATE_S
    if args.smoke:
        args.repeats, args.calls, args.unit_ms, gate_s = 2, 12, 0.1, 0.05
    results = bench(args.calls, args.repeats, args.unit_ms / 1e3, args.seed, EXECUTORS, gate_s)
    coverage = stats.median_interval([0.0] * args.repeats).coverage
    data = {
        "smoke": args.smoke, "machine": _common.machine(), "calls": args.calls, "repeats": args.repeats,
        "unit_ms": args.unit_ms, "seed": args.seed, "coverage": coverage, "max_cost": MAX_COST,
        "executors": list(EXECUTORS), "results": results,
    }
    text = markdown(data)
    _common.write(args.out, "fairness", data, text)
    print(f"wrote the results into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
