"""Where the API server's event-loop thread spends its time, per strategy.

Issue 11's CPU table says how much loop-thread CPU a request costs; this says
on what. For each row (one server at a time: tiny BERT, 160-word inputs, 64
closed-loop clients, as `bench_paired`), py-spy samples the API server's
threads while the load runs, and every sample of the event-loop thread
(`MainThread`) is put in one category by the innermost frame that names one:
offload's own code, the strategy's hand-off, vLLM's engine client, FastAPI's
parsing and validation, the HTTP/ASGI stack, or the event loop's own C code.
py-spy counts a thread only while it runs (not while it waits in a system
call), so the shares approximate where its CPU goes; the CPU per request
beside them is read from `/proc` over the same window.

    python -m benchmarks.profile_loop                        # vLLM default, thread, process
    python -m benchmarks.profile_loop --rows process --seconds 30

Needs py-spy (the `bench` extra). Writes profile_loop.json and profile_loop.md
into --out (default benchmarks/results/).
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import models  # noqa: E402
from benchmarks.bench_paired import DEFAULT, ROWS, WORKLOADS, config  # noqa: E402
from benchmarks.e2e import load, procstat  # noqa: E402
from benchmarks.e2e.server import running_server_process  # noqa: E402

#: (category, pattern of a frame). The innermost frame that matches one decides;
#: the order breaks ties within a frame.
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("offload: executor and adapter", r"\(offload/_[a-z]|\(offload_vllm/_[a-z]"),
    ("vLLM engine client: send to engine (msgspec, zmq)", r"add_request_async|_send_input|send_multipart"),
    ("vLLM engine client: input processing", r"InputProcessor|process_inputs|AsyncLLM\._?add_request"),
    ("vLLM engine client: output handler", r"output_handler|process_outputs|OutputProcessor|get_output_async"),
    ("vLLM rendering and post-processing", r"renderers/|_postprocessing|_build_response|io_processor"),
    ("vLLM pooling request set-up (ctx, ids, generators)", r"_init_ctx|_prepare_generators|_collect_batch|merge_async_iterators|_log_inputs"),
    ("FastAPI: body parsing and pydantic validation", r"solve_dependencies|validate_python|ModelField|_get_body|Request\.(json|body)|validate_json_request"),
    ("HTTP and ASGI (uvicorn, Starlette middleware, routing)", r"httptools|uvicorn/|starlette/|fastapi/|prometheus_fastapi_instrumentator"),
)
LOOP_ITSELF = "event loop's own C code (I/O polling, callbacks)"
OTHER = "other Python"


def categorize(frames: list[str]) -> str:
    for frame in reversed(frames):  # innermost first
        for name, pattern in CATEGORIES:
            if re.search(pattern, frame):
                return name
    if frames and re.search(r"\((uvloop|asyncio)/", frames[-1]):
        return LOOP_ITSELF
    return OTHER


def loop_thread_shares(raw: str) -> tuple[int, dict[str, int]]:
    """Samples of the event-loop thread in py-spy's raw output, by category."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        thread, *frames = stack.split(";")
        if "MainThread" not in thread:
            continue
        total += int(n)
        counts[categorize(frames)] += int(n)
    return total, dict(counts)


def profile_row(row: str, model: Path, seconds: float, clients: int, logs: Path) -> dict[str, Any]:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    payload = WORKLOADS["tiny"][1](str(model))
    with running_server_process(config(row), model, logs / f"profile-{row}.log") as (url, pid):
        load.run_level(url, "/v1/embeddings", clients, payload, 3.0, max_requests=10**9)  # warm
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch) / "raw.txt"
            spy = subprocess.Popen(
                [py_spy, "record", "--pid", str(pid), "--threads", "--nonblocking", "--rate", "250",
                 "--duration", str(round(seconds)), "--format", "raw", "--output", str(out)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            before = procstat.snapshot(pid)
            level = load.run_level(url, "/v1/embeddings", clients, payload, seconds, max_requests=10**9)
            after = procstat.snapshot(pid)
            spy.wait(timeout=seconds + 60)
            raw = out.read_text() if out.exists() else ""
    used = procstat.cpu_used(before, after)
    done = max(level.requests, 1)
    total, counts = loop_thread_shares(raw)
    return {
        "requests": level.requests,
        "requests_per_s": level.requests_per_s,
        "cpu_ms_per_request": {part: 1e3 * s / done for part, s in used.items()},
        "loop_samples": total,
        "loop_samples_by_category": counts,
    }


def markdown(result: dict[str, Any]) -> str:
    rows = result["rows"]
    names = [name for name, _ in CATEGORIES] + [LOOP_ITSELF, OTHER]
    header = "| loop-thread time on | " + " | ".join(rows) + " |\n|---|" + "---|" * len(rows) + "\n"
    lines = []
    for name in names:
        cells = []
        for row in rows.values():
            share = row["loop_samples_by_category"].get(name, 0) / max(row["loop_samples"], 1)
            ms = share * row["cpu_ms_per_request"]["loop"]
            cells.append(f"{100 * share:.0f}% ({ms:.2f} ms)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    cpu = " | ".join(f"{r['cpu_ms_per_request']['loop']:.2f}" for r in rows.values())
    api = " | ".join(f"{r['cpu_ms_per_request']['api']:.2f}" for r in rows.values())
    rps = " | ".join(f"{r['requests_per_s']:.0f}" for r in rows.values())
    return (
        "<!-- --8<-- [start:tables] -->\n"
        f"`python -m benchmarks.profile_loop {' '.join(result['argv'])}` on {result['machine']}, "
        f"{result['started']}, commit `{result['commit']}`: {result['clients']} clients, "
        f"{result['seconds']:.0f} s per row, one row at a time. Share of the event-loop thread's "
        "py-spy samples, and that share of its CPU per request (ms, from `/proc`):\n\n"
        + header + "\n".join(lines) + "\n"
        f"| **loop-thread CPU per request (ms)** | {cpu} |\n"
        f"| API-server process CPU per request (ms) | {api} |\n"
        f"| requests/s | {rps} |\n"
        "<!-- --8<-- [end:tables] -->\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", nargs="+", choices=ROWS, default=[DEFAULT, "thread", "process"])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    result: dict[str, Any] = {
        "argv": sys.argv[1:] if argv is None else argv,
        "machine": f"{platform.machine()} {__import__('os').cpu_count()} CPUs",
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit,
        "clients": args.clients,
        "seconds": args.seconds,
        "rows": {},
    }
    with tempfile.TemporaryDirectory() as scratch:
        model = models.build_tiny_embedding_model(Path(scratch) / "tiny-bert")
        for row in args.rows:
            result["rows"][row] = profile_row(row, model, args.seconds, args.clients, args.out / "logs")
            print(row, json.dumps(result["rows"][row]["cpu_ms_per_request"]), flush=True)
    (args.out / "profile_loop.json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result)
    (args.out / "profile_loop.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
