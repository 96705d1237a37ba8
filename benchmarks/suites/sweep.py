"""End-to-end benchmark: vLLM pooling server under each offload strategy, and vLLM's own answers.

For every row (the four strategies through the `offload_vllm` adapter, vLLM with
no plugin, vLLM with no plugin and `--api-server-count 2`) and every workload:

1. overhead: latency of a short embedding request at 1 client, online (HTTP) and
   offline (`LLM.embed`, one process per row);
2. a closed-loop concurrency sweep (1..128 clients): tokens/s, requests/s, mean/p99 latency;
3. `/health` p50/p99/max, probed from another process while each level runs;
4. a post-processing-heavy case: 256 inputs per request.

    python -m benchmarks sweep            # quick (make bench-sweep)
    python -m benchmarks sweep --full     # all levels, longer levels, MiniLM too (make bench-full)
    python -m benchmarks sweep --smoke --out DIR   # one row, two levels, a few requests

Writes e2e.json, e2e.md and PNG plots into --out (default .benchmarks/runs/sweep/).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import common as _common
from benchmarks.harness import load, progress, report, workloads
from benchmarks.harness.server import ServerConfig, ServerFailed, adapter_installed, running_server

ROOT = Path(__file__).resolve().parents[2]

# Starting one real server is most of the smoke run; the smoke test allows this much.
SMOKE_TIMEOUT_S = 900

STRATEGY_ROWS = ("inline", "thread", "process", "async-renderer")
ALL_CLIENTS = (1, 2, 4, 8, 16, 32, 64, 128)
QUICK_CLIENTS = (1, 4, 16, 64, 128)


def server_configs(renderer_flag: bool) -> list[ServerConfig]:
    # `--renderer-num-workers 1` is vLLM's default pool, stated so the row is explicit.
    default_args = ("--renderer-num-workers", "1") if renderer_flag else ()
    rows = [ServerConfig(f"offload {s}", strategy=s) for s in STRATEGY_ROWS]
    rows.append(ServerConfig(report.DEFAULT_ROW, extra_args=default_args))
    rows.append(ServerConfig("vLLM api-server-count 2", extra_args=(*default_args, "--api-server-count", "2")))
    return rows


def vllm_engine_field(name: str) -> bool:
    """Whether this vLLM's engine arguments have `name` (so its `--flag` form exists)."""
    from vllm.engine.arg_utils import EngineArgs

    return any(f.name == name for f in dataclasses.fields(EngineArgs))


def adapter_strategies() -> set[str]:
    """Strategies the adapter can serve in this environment (empty when it is not installed)."""
    if not adapter_installed():
        return set()
    import offload

    return set(offload.STRATEGIES)


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def git_dirty() -> bool:
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                            capture_output=True, text=True, check=False).stdout
    return bool(status.strip())


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


@dataclass(frozen=True)
class Workload:
    description: str
    build: Callable[[Path], Path]
    # payload factory for the sweep, given the served model name
    sweep: Callable[[str], Callable[[int], workloads.Payload]]
    overhead: Callable[[str], workloads.Payload]
    heavy: bool  # whether the many-inputs case applies
    offline: bool  # whether `LLM.embed` on a short text applies
    # vLLM arguments every row of this workload gets, so rows stay comparable
    server_args: tuple[str, ...] = ()


def _tiny(root: Path) -> Path:
    from benchmarks.harness import models

    return models.build_tiny_embedding_model(root / models.EMBED_NAME)


def _minilm(root: Path) -> Path:
    from benchmarks.harness import models

    return models.minilm_dir()


def _clip(root: Path) -> Path:
    from benchmarks.harness.multimodal import CLIP_NAME, build_tiny_clip

    return build_tiny_clip(root / CLIP_NAME)


def _short(model: str) -> workloads.Payload:
    return workloads.embed_payload(model, workloads.SHORT_TEXT)


WORKLOADS = {
    "tiny": Workload(
        "Frontend-bound: randomly initialised 1-layer BERT (hidden 64, 2 heads) with the MiniLM "
        "tokenizer; each sweep request embeds one 160-word text, so tokenization and response "
        "building dominate and the forward costs almost nothing.",
        _tiny, workloads.long_text_factory, _short, heavy=True, offline=True),
    "minilm": Workload(
        "Real: the packaged all-MiniLM-L6-v2 (6 layers, hidden 384); same requests.",
        _minilm, workloads.long_text_factory, _short, heavy=True, offline=True),
    "clip": Workload(
        "Multimodal: randomly initialised tiny CLIP (1 layer per tower, hidden 64) built locally; "
        "each request embeds one random-noise 224 px JPEG sent as base64 in `messages`.",
        _clip, workloads.image_factory, lambda m: workloads.image_factory(m)(0), heavy=False, offline=False,
        # vLLM's multimodal processor cache cannot be shared by several renderer
        # workers (the adapter refuses `thread`/`process` with it, as vLLM refuses
        # --renderer-num-workers > 1): every row runs without it.
        server_args=("--mm-processor-cache-gb", "0")),
}


def offline_overhead(config: ServerConfig, model: Path, n: int, log_dir: Path, timeout: float) -> dict[str, Any]:
    out = log_dir / f"offline-{config.name.replace(' ', '_')}.json"
    env = config.environment()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    with open(log_dir / f"offline-{config.name.replace(' ', '_')}.log", "wb") as log:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.harness.offline", str(model), str(n), str(out)],
            env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, check=False,
            start_new_session=True,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"offline run exited with {proc.returncode}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def measure_row(
    config: ServerConfig, model_name: str, workload: Workload, model: Path, args: argparse.Namespace, log_dir: Path, bar: progress.Progress,
) -> dict[str, Any]:
    config = dataclasses.replace(config, extra_args=(*config.extra_args, *workload.server_args))
    if args.smoke:
        config = config.for_smoke()
    row: dict[str, Any] = {"strategy": config.strategy, "args": list(config.extra_args), "status": "ok"}
    started = time.monotonic()
    served = str(model)
    with running_server(config, model, log_dir / f"server-{model_name}-{config.name.replace(' ', '_')}.log",
                        args.ready_timeout) as url:
        row["startup_s"] = round(time.monotonic() - started, 1)
        # Warm-up: first requests compile/allocate; not measured, but must succeed.
        warm = load.run_level(url, "/v1/embeddings", 4, workload.sweep(served), 60.0, 16)
        if warm.errors:
            raise RuntimeError(f"{warm.errors} of 16 warm-up requests failed; first: {warm.first_error}")
        lat = load.sequential_latencies(url, "/v1/embeddings", workload.overhead(served), args.overhead_requests)
        row["overhead_online"] = load.summarize_ms(lat)
        row["sweep"] = []
        for clients in args.clients:
            level = load.run_level(url, "/v1/embeddings", clients, workload.sweep(served),
                                   args.level_seconds, args.level_max_requests)
            row["sweep"].append(level.as_dict())
            bar.step(f"{model_name} / {config.name} / {clients} clients")
        row["heavy"] = []
        for clients in args.heavy_clients if workload.heavy else []:
            level = load.run_level(url, "/v1/embeddings", clients,
                                   workloads.many_texts_factory(served, args.heavy_inputs),
                                   args.level_seconds, max(4, args.level_max_requests // 16))
            row["heavy"].append(level.as_dict())
            bar.step(f"{model_name} / {config.name} / heavy {clients} clients")
    if args.offline_requests and workload.offline and config.name in args.offline_rows:
        bar.note(f"{model_name} / {config.name}: offline overhead")
        try:
            row["overhead_offline"] = offline_overhead(config, model, args.offline_requests, log_dir,
                                                       args.ready_timeout)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            row["offline_error"] = str(exc)
    return row


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="one row, two levels, a few requests")
    p.add_argument("--full", action="store_true", help="all levels 1..128, longer levels, MiniLM too")
    p.add_argument("--out", type=Path, default=_common.RESULTS / "sweep")
    p.add_argument("--rows", nargs="*", help="row names to run (default: all available)")
    p.add_argument("--workloads", nargs="*", choices=list(WORKLOADS))
    p.add_argument("--clients", nargs="*", type=int)
    p.add_argument("--level-seconds", type=float)
    p.add_argument("--ready-timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    if args.smoke:
        defaults: dict[str, Any] = {
            "workloads": ["tiny"], "clients": [1, 8], "level_seconds": 2.0, "level_max_requests": 40,
            "overhead_requests": 5, "offline_requests": 0, "heavy_clients": [2], "heavy_inputs": 32,
            "offline_rows": [],
            "rows": args.rows or [report.DEFAULT_ROW],
        }
    elif args.full:
        defaults = {
            "workloads": ["tiny", "minilm", "clip"], "clients": list(ALL_CLIENTS), "level_seconds": 10.0,
            "offline_rows": [c.name for c in server_configs(True) if "api-server" not in c.name],
            "level_max_requests": 20000, "overhead_requests": 200, "offline_requests": 200,
            "heavy_clients": [1, 4, 16], "heavy_inputs": 256,
        }
    else:
        defaults = {
            "workloads": ["tiny"], "clients": list(QUICK_CLIENTS), "level_seconds": 4.0,
            # One LLM start per row costs a minute here: quick mode keeps the seeds' pair.
            "offline_rows": [report.DEFAULT_ROW, "offload thread"],
            "level_max_requests": 5000, "overhead_requests": 50, "offline_requests": 50,
            "heavy_clients": [1, 8], "heavy_inputs": 256,
        }
    for key, value in defaults.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # `kill PID` must still stop the server under test (the `with` block's cleanup), not orphan it.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        return _run(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _run(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    t0 = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    renderer_flag = vllm_engine_field("renderer_num_workers")
    notes = []
    if not renderer_flag:
        notes.append("vLLM has no --renderer-num-workers flag; the default rows use its default pool")
    available = adapter_strategies()
    if not available:
        notes.append("the offload_vllm adapter is not installed: offload rows not measured")
    configs = [c for c in server_configs(renderer_flag) if not args.rows or c.name in args.rows]
    results: dict[str, Any] = {"meta": {
        **_common.machine(), "cpu": cpu_model(), "loadavg_before": loadavg(), "git_dirty": git_dirty(),
        "mode": "smoke" if args.smoke else "full" if args.full else "quick",
        "clients": args.clients, "level_seconds": args.level_seconds,
        "level_max_requests": args.level_max_requests, "notes": notes,
    }, "workloads": {}}
    with tempfile.TemporaryDirectory(prefix="offload-bench-") as tmp:
        model_paths = {w: WORKLOADS[w].build(Path(tmp) / "models") for w in args.workloads}
        log_dir = args.out / "logs"
        log_dir.mkdir(exist_ok=True)
        runnable = [c for c in configs if c.strategy is None or c.strategy in available]
        steps = len(runnable) * sum(
            len(args.clients) + (len(args.heavy_clients) if WORKLOADS[w].heavy else 0) for w in model_paths
        )
        # A step is one level; each row's server start (a minute or two) falls inside its first.
        with progress.Progress(steps, "sweep levels") as bar:
            for wname, model in model_paths.items():
                rows: dict[str, Any] = {}
                for config in configs:
                    if config not in runnable:
                        why = "adapter not installed" if not available else "strategy not available"
                        rows[config.name] = {"strategy": config.strategy, "status": f"skipped: {why}"}
                        continue
                    try:
                        rows[config.name] = measure_row(config, wname, WORKLOADS[wname], model, args, log_dir, bar)
                    except (ServerFailed, RuntimeError) as exc:
                        # One broken row is a result too; the others still run.
                        rows[config.name] = {"strategy": config.strategy, "status": f"failed: {exc}"}
                results["workloads"][wname] = {"description": WORKLOADS[wname].description, "model": str(model),
                                               "heavy_inputs": args.heavy_inputs, "rows": rows}
    results["meta"]["loadavg_after"] = loadavg()
    results["meta"]["wall_s"] = time.monotonic() - t0
    plots = {w: report.plot(w, wl, args.out) for w, wl in results["workloads"].items()}
    for wl in results["workloads"].values():
        wl["targets"] = report.targets(wl)
    (args.out / "e2e.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "e2e.md").write_text(report.markdown(results, plots))
    print(f"wrote {args.out / 'e2e.md'} in {results['meta']['wall_s']:.0f} s")
    statuses = [str(r.get("status", "")) for wl in results["workloads"].values() for r in wl["rows"].values()]
    failed = [s for s in statuses if s.startswith("failed")]
    for status in failed:
        print(status, file=sys.stderr)
    # A failed row is reported, not fatal; a run that measured nothing is.
    return 0 if "ok" in statuses else 1


if __name__ == "__main__":
    sys.exit(main())
