"""Where the API server's event-loop thread spends its time, per strategy.

The paired benchmark's CPU table says how much loop-thread CPU a request costs; this says
on what. For each row (one server at a time: tiny BERT, 160-word inputs, 64
closed-loop clients, as `bench_paired`), py-spy samples the API server's
threads while the load runs, and every sample of the event-loop thread
(`MainThread`) is put in one category by the innermost frame that names one:
offload's own code, the strategy's hand-off, vLLM's engine client, FastAPI's
parsing and validation, the HTTP/ASGI stack, or the event loop's own C code.
The CPU per request beside the shares is read from `/proc` over the same
window.

py-spy unwinds native frames too (`--native`, the default), for one reason:
without them it cannot tell a loop that waits in `epoll_wait` from one that
runs, and files the waiting under "the event loop's own C code" (in a run
without native frames that category was 11% of the loop's samples under
vLLM's default and 34% under `process`, commit f746fe3; with native frames,
most of that is waits in `epoll_pwait`). Samples whose innermost frame is an
I/O wait are counted as idle, reported as their own share, and left out of
the shares of the loop's work. Unwinding native frames
means pausing the server for each sample, which slows it: read the shares;
the CPU per request of a native run is lower than an unpaused run's (the
paired benchmark is the measurement of CPU per request). With native
frames, each category also says what share of the loop's samples were inside a
write system call ("in write"): there the loop wakes a reader, an HTTP client
or ZeroMQ's I/O thread, and a reader on the same CPUs may take the CPU from it
inside the call.

    python -m benchmarks profile-loop                        # vLLM default, thread, process
    python -m benchmarks profile-loop --rows process --seconds 30
    python -m benchmarks profile-loop --no-native            # no pauses, but idle waits count as C code
    python -m benchmarks profile-loop --workload truncated --clients 8   # 150 KB bodies
    python -m benchmarks profile-loop --workload rerank --rows 'vLLM default' thread --clients 8

`--workload` takes the paired suite's workloads (`benchmarks/suites/paired.py`),
each on its model and route: `rerank` (`/rerank` on a tiny cross-encoder) and
`multilingual` (an XLM-R-style embedding model) among them. A share is of
samples, not of CPU: where workers keep the cores busy (`thread` on those
bodies), a loop preempted inside a long call (decoding a 1 MB body) is
sampled there all the same, so read offload's own rows beside a count of
their work. The loop-lag sampler runs at a fixed rate: its ms per request
fall as requests/s rise, and the pauses lower requests/s.

Needs py-spy (the `bench` extra) and the right to trace the server (ptrace).
Writes profile_loop.json and profile_loop.md (`--no-native`:
profile_loop_python.*) into --out (default benchmarks/results/).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import common as _common
from benchmarks.harness import load, procstat, progress
from benchmarks.harness.server import running_server_process
from benchmarks.suites.paired import (
    DEFAULT,
    MODEL_WORKLOADS,
    ROWS,
    WORKLOADS,
    build_workload,
    config,
    describe_workload,
)

ROOT = Path(__file__).resolve().parents[2]

#: (category, pattern of a frame). The innermost frame that matches one decides;
#: the order breaks ties within a frame.
CATEGORIES: tuple[tuple[str, str], ...] = (
    # offload's own steps first: the catch-all of offload's code follows them.
    ("offload: door middleware", r"^RefuseWhenFull\.\w+ \(offload_vllm/"),
    ("offload: pricing (a request's cost)", r"\(offload_vllm/(_cost|_image_header|_seams/requests)\.py"),
    ("offload: validation shortcut", r"\(offload_vllm/_seams/validation\.py"),
    ("offload: prefix-tokenization planning", r"\(offload_vllm/_prefix/"),
    ("offload: metrics", r"\(offload/_metrics\.py|\(offload_vllm/(_phases|_loop_calls|_metric_family)\.py"),
    # A fixed rate (100 wake-ups a second), not per request: its ms per request
    # fall as requests/s rise, and py-spy's pauses lower requests/s.
    ("offload: loop-lag sampler (per second, not per request)", r"\(offload/_lag\.py"),
    ("offload: executor and adapter", r"\(offload/_[a-z]|\(offload_vllm/_[a-z]"),
    ("JSON decoding (the request body)", r"^(loads|JSONDecoder\.\w+) \(json/"),
    ("response encoding (JSON, model_dump)", r"^(dumps|JSONEncoder\.\w+) \(json/|jsonable_encoder|serialize_response|JSONResponse\.render|model_dump"),
    ("vLLM engine client: send to engine (msgspec, zmq)", r"add_request_async|_send_input|send_multipart"),
    ("vLLM engine client: input processing", r"InputProcessor|process_inputs|AsyncLLM\._?add_request"),
    ("vLLM engine client: output handler", r"output_handler|process_outputs|OutputProcessor|get_output_async"),
    ("vLLM rendering and post-processing", r"renderers/|_postprocessing|_build_response|io_processor"),
    ("vLLM pooling request set-up (ctx, ids, generators)", r"_init_ctx|_prepare_generators|_collect_batch|merge_async_iterators|_log_inputs"),
    ("FastAPI: body parsing and pydantic validation", r"solve_dependencies|validate_python|ModelField|_get_body|Request\.(json|body)|validate_json_request"),
    ("HTTP and ASGI (uvicorn, Starlette middleware, routing)", r"httptools|uvicorn/|starlette/|fastapi/|prometheus_fastapi_instrumentator"),
)
LOOP_ITSELF = "event loop's own C code (I/O polling, callbacks)"
#: Where the samples of a loop waiting in an I/O poll are counted (not a share of its work).
IDLE = "waiting for I/O (idle)"
#: Native functions in which the loop thread waits, not runs.
IDLE_NATIVE = frozenset({"epoll_wait", "epoll_pwait", "epoll_pwait2", "poll", "ppoll", "select", "pselect"})
OTHER = "other Python"
#: Innermost native frames of a thread inside a write system call. The loop
#: writes to wake a reader: an HTTP client (on this host in the benchmarks) or
#: ZeroMQ's I/O thread, which sends to the engine. The kernel wakes the reader
#: inside the call and may hand it the CPU there, so a loop preempted by the
#: thread it woke is sampled here (py-spy cannot tell preempted from running).
WRITE_NATIVE = frozenset({"write", "writev", "send", "sendto", "sendmsg"})


_PYTHON_FRAME = re.compile(r"\([^()]*\.py:\d+\)$")


def categorize(frames: list[str]) -> str:
    # Native frames (py-spy --native) never decide: they sit under Python ones.
    frames = [f for f in frames if _PYTHON_FRAME.search(f)]
    for frame in reversed(frames):  # innermost first
        for name, pattern in CATEGORIES:
            if re.search(pattern, frame):
                return name
    if frames and re.search(r"\((uvloop|asyncio)/", frames[-1]):
        return LOOP_ITSELF
    return OTHER


def loop_thread_shares(
    raw: str,
    natives: collections.Counter[str] | None = None,
    writes: collections.Counter[str] | None = None,
) -> tuple[int, dict[str, int]]:
    """Running samples of the event-loop thread in py-spy's raw output, by
    category. Samples waiting in an I/O poll (`IDLE_NATIVE`, seen only with
    native frames) are not counted. With `natives`, the samples of the loop's
    own C code are also counted there by their innermost native frame. With
    `writes`, running samples inside a write system call (`WRITE_NATIVE`) are
    also counted there by their category."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        thread, *frames = stack.split(";")
        if "MainThread" not in thread:
            continue
        samples = int(n)
        innermost = frames[-1].split(" (")[0] if frames else ""
        if innermost in IDLE_NATIVE:
            counts[IDLE] += samples
            continue
        total += samples
        category = categorize(frames)
        counts[category] += samples
        if writes is not None and innermost in WRITE_NATIVE:
            writes[category] += samples
        if natives is not None and category == LOOP_ITSELF and frames and not _PYTHON_FRAME.search(frames[-1]):
            natives[innermost] += samples
    return total, dict(counts)


def profile_row(
    row: str, model: Path, seconds: float, clients: int, logs: Path, *,
    native: bool = False, workload: str = "tiny", payload: Any = None, path: str = "/v1/embeddings",
) -> dict[str, Any]:
    """One row's server under `clients` closed-loop clients for `seconds`,
    sampled by py-spy; `payload`, the requests' bodies (a `workloads.Rotation`,
    by default `workload`'s on `model`), sent to `path`."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if payload is None:
        payload = WORKLOADS[workload][1](str(model))
    # The bodies as JSON bytes, encoded once, as the paired suite sends them.
    send = payload.body
    with running_server_process(config(row), model, logs / f"profile-{row}.log") as (url, pid):
        load.run_level(url, path, clients, send, 3.0, max_requests=10**9)  # warm
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch) / "raw.txt"
            spy = subprocess.Popen(
                [py_spy, "record", "--pid", str(pid), "--threads",
                 *(["--native"] if native else ["--nonblocking"]), "--rate", "250",
                 "--duration", str(round(seconds)), "--format", "raw", "--output", str(out)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            before = procstat.snapshot(pid)
            level = load.run_level(url, path, clients, send, seconds, max_requests=10**9)
            after = procstat.snapshot(pid)
            spy.wait(timeout=seconds + 60)
            raw = out.read_text() if out.exists() else ""
    # The raw samples stay beside the server's log, for reading below the categories.
    (logs / f"profile-{row.replace(' ', '-')}-{workload}.raw.txt").write_text(raw)
    used = procstat.cpu_used(before, after)
    done = max(level.requests, 1)
    natives: collections.Counter[str] = collections.Counter()
    writes: collections.Counter[str] = collections.Counter()
    total, counts = loop_thread_shares(raw, natives, writes)
    return {
        "requests": level.requests,
        "requests_per_s": level.requests_per_s,
        "cpu_ms_per_request": {part: 1e3 * s / done for part, s in used.items()},
        "loop_switches_per_request": {
            kind: n / done for kind, n in procstat.loop_switches(before, after).items()
        },
        "loop_samples": total,
        "loop_samples_by_category": counts,
        "loop_c_code_by_native_function": dict(natives.most_common(12)),
        "loop_write_samples_by_category": dict(writes),
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
            written = row.get("loop_write_samples_by_category", {}).get(name, 0) / max(row["loop_samples"], 1)
            cells.append(f"{100 * share:.0f}% ({ms:.2f} ms)" + (f"; {100 * written:.0f}% in write" if written else ""))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    cpu = " | ".join(f"{r['cpu_ms_per_request']['loop']:.2f}" for r in rows.values())
    api = " | ".join(f"{r['cpu_ms_per_request']['api']:.2f}" for r in rows.values())
    rps = " | ".join(f"{r['requests_per_s']:.0f}" for r in rows.values())
    kernel = " | ".join(
        f"{r['cpu_ms_per_request'].get('loop_kernel', 0.0):.2f}" for r in rows.values()
    )
    sleeps = " | ".join(
        f"{r.get('loop_switches_per_request', {}).get('sleeps', 0.0):.1f} / "
        f"{r.get('loop_switches_per_request', {}).get('preempted', 0.0):.1f}"
        for r in rows.values()
    )
    idle = " | ".join(
        f"{100 * r['loop_samples_by_category'].get(IDLE, 0) / max(r['loop_samples'] + r['loop_samples_by_category'].get(IDLE, 0), 1):.0f}%"
        for r in rows.values()
    )
    natives = ""
    if any(r.get("loop_c_code_by_native_function") for r in rows.values()):
        natives = (
            "\nThe event loop's own C code (running samples only), by innermost native function "
            "(share of that category):\n\n"
        )
        for name, r in rows.items():
            found = r.get("loop_c_code_by_native_function") or {}
            whole = max(r["loop_samples_by_category"].get(LOOP_ITSELF, 0), 1)
            top = ", ".join(f"`{fn}` {100 * n / whole:.0f}%" for fn, n in list(found.items())[:8])
            natives += f"- {name}: {top or '–'}\n"
    return (
        "<!-- --8<-- [start:tables] -->\n"
        f"`python -m benchmarks profile-loop {shlex.join(result['argv'])}` on {result['machine']}, "
        f"{result['started']}, commit `{result['commit']}`: {describe_workload(result.get('workload', 'tiny'))}, "
        f"{result['clients']} clients, "
        f"{result['seconds']:.0f} s per row, one row at a time"
        + (", native frames (the server paused per sample)" if result.get("native") else ", Python frames only")
        + ". Share of the event-loop thread's running py-spy samples"
        + (" (waits in epoll left out)" if result.get("native") else " (waits in epoll counted as C code)")
        + ", and that share of its CPU per request (ms, from `/proc`, same window); "
        "\"in write\": the share of the same samples inside a write system call, where the loop "
        "wakes a reader (an HTTP client, ZeroMQ's I/O thread) that may take the CPU from it:\n\n"
        + header + "\n".join(lines) + "\n"
        f"| **loop-thread CPU per request (ms)** | {cpu} |\n"
        f"| API-server process CPU per request (ms) | {api} |\n"
        f"| of which in the kernel (ms) | {kernel} |\n"
        f"| loop-thread samples waiting in epoll (left out of the shares) | {idle} |\n"
        f"| loop-thread sleeps / preemptions per request | {sleeps} |\n"
        f"| requests/s | {rps} |\n"
        + natives
        + "<!-- --8<-- [end:tables] -->\n"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The tool's options; an unknown row or workload exits with status 2 (argparse's)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", nargs="+", choices=ROWS, default=[DEFAULT, "thread", "process"])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument(
        "--workload", choices=sorted([*WORKLOADS, *MODEL_WORKLOADS]), default="tiny",
        help="the paired suite's workloads (benchmarks/suites/paired.py), on their models and routes",
    )
    p.add_argument(
        "--native", action=argparse.BooleanOptionalAction, default=True,
        help="unwind native frames, to leave I/O waits out (pauses the server per sample)",
    )
    p.add_argument("--out", type=Path, default=_common.RESULTS / "profile-loop")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    result: dict[str, Any] = {
        "argv": sys.argv[1:] if argv is None else argv,
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit,
        "clients": args.clients,
        "workload": args.workload,
        "seconds": args.seconds,
        "native": args.native,
        "rows": {},
    }
    with tempfile.TemporaryDirectory() as scratch:
        model, payload, path = build_workload(args.workload, Path(scratch))
        with progress.Progress(len(args.rows), "profiled rows") as bar:
            for row in args.rows:
                result["rows"][row] = profile_row(
                    row, model, args.seconds, args.clients, args.out / "logs",
                    native=args.native, workload=args.workload, payload=payload, path=path,
                )
                bar.step(row)
                bar.note(f"{row}: {json.dumps(result['rows'][row]['cpu_ms_per_request'])}")
    stem = "profile_loop" if args.native else "profile_loop_python"
    if args.workload != "tiny":
        stem += f"_{args.workload}"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result)
    (args.out / f"{stem}.md").write_text(text)
    print(f"wrote the results into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
