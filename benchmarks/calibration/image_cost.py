"""What an image request costs the API server's event loop, against the price the adapter puts on it.

The vLLM adapter prices a request before rendering it (`offload_vllm/_cost.py`,
in characters at ~0.36 µs each): an image given as a data URL counts its
base64 characters, `IMAGE_COST`, `PIXEL_COST` per pixel and `PROMPT_COST`. The
price here is the adapter's own (`request_cost` on vLLM's parsed request), as
admission charges it, at the commit that runs the suite; the last column, the
loop CPU above the text request's over the price's time, is at most 1 where
the price bounds the work. Here one server
runs the `inline` strategy, so each request's rendering and response are
built on its event loop, and the loop thread's CPU time per request is read
from `/proc/PID/task/PID/schedstat` (steadier than wall time). Requests are
sent one at a time: a one-image `/v1/embeddings` request per size (tiny CLIP,
photo-like JPEGs, as `bench_mixed --variant multimodal`), and a short text
request as the baseline of what any request costs the loop (HTTP, parsing,
the engine client). Kinds run in a fresh random order each round.

    python -m benchmarks image-cost         # writes results/image-cost.{json,md}
    python -m benchmarks image-cost --smoke
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import common as _common
from benchmarks.harness import mixed, progress
from benchmarks.harness.multimodal import build_tiny_clip
from benchmarks.harness.server import ServerConfig, running_server_process
from benchmarks.harness.stats import median_interval
from benchmarks.harness.thread_states import read_schedstat

ROOT = Path(__file__).resolve().parents[2]

#: Starts a vLLM server (`test_benchmark_smoke`).
SMOKE_TIMEOUT_S = 900
SIZES = (32, 96, 256, 512, 1024)
#: The adapter's figure for a character of text (`_cost.py`).
MICROSECONDS_PER_UNIT = 0.36
TEXT = "text"
SERVER = ServerConfig(
    "inline", "inline", ("--gpu-memory-utilization", "0.1", "--mm-processor-cache-gb", "0")
)


def loop_cpu_ns(pid: int) -> int:
    """CPU time of the API server's main thread (its event loop), in ns."""
    return read_schedstat(f"/proc/{pid}/task/{pid}/schedstat")[0]


def price(body: bytes) -> float:
    """What the adapter charges for `body` at admission: vLLM's own parsing of
    an embeddings request, then the adapter's `request_cost`."""
    import warnings

    import pydantic

    # vLLM's import warns (torch deprecations); under pytest's warnings-as-errors
    # that would fail the smoke run when no vLLM test imported it first.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from offload_vllm._seams.requests import request_cost
        from vllm.entrypoints.pooling.embed.protocol import EmbeddingRequest

    return request_cost(pydantic.TypeAdapter(EmbeddingRequest).validate_json(body), len(body))


def measure(url: str, pid: int, bodies: list[bytes]) -> list[float]:
    """Loop CPU (ms) of each request of `bodies`, sent one at a time."""
    import httpx

    spent = []
    with httpx.Client(timeout=120) as client:
        for body in bodies:
            before = loop_cpu_ns(pid)
            r = client.post(f"{url}/v1/embeddings", content=body, headers={"content-type": "application/json"})
            if r.status_code != 200:
                raise RuntimeError(f"{r.status_code}: {r.text[:300]}")
            time.sleep(0.02)  # the response's last writes are the loop's too
            spent.append((loop_cpu_ns(pid) - before) / 1e6)
    return spent


def main(argv: list[str] | None = None) -> int:
    p = _common.parser(__doc__.splitlines()[0], "image-cost")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=20, help="requests of each kind per round")
    args = p.parse_args(argv)
    sizes, rounds, count, server = SIZES, args.rounds, args.requests, SERVER
    if args.smoke:
        sizes, rounds, count, server = (32,), 1, 2, SERVER.for_smoke()
    info = _common.machine()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_clip(Path(tmp) / "tiny-clip")
        kinds: dict[str, list[bytes]] = {
            TEXT: [json.dumps({"model": str(model), "input": f"a photo of item {i}"}).encode() for i in range(count)]
        }
        for size in sizes:
            kinds[str(size)] = mixed.image_bodies(str(model), count=count, images=1, size=size, seed=size)
        spent: dict[str, list[float]] = {kind: [] for kind in kinds}
        with running_server_process(server, model, Path(tmp) / "server.log") as (url, pid):
            measure(url, pid, kinds[TEXT][:2] + kinds[str(sizes[0])][:2])  # warm up
            order = random.Random(0)
            with progress.Progress(rounds, "image-cost rounds") as bar:
                for _ in range(rounds):
                    for kind in order.sample(list(kinds), len(kinds)):
                        spent[kind] += measure(url, pid, kinds[kind])
                    bar.step()
    text_ms = statistics.median(spent[TEXT])
    rows: list[dict[str, Any]] = []
    for kind, bodies in kinds.items():
        cpu = median_interval(spent[kind])
        priced = statistics.mean(price(b) for b in bodies)
        rows.append({
            "kind": kind, "body_bytes": statistics.mean(len(b) for b in bodies), "price": priced,
            "price_ms": priced * MICROSECONDS_PER_UNIT / 1000, "loop_cpu_ms": cpu.median,
            "loop_cpu_interval": [cpu.low, cpu.high], "above_text_ms": cpu.median - text_ms,
            "samples": len(spent[kind]),
        })
    data = {"machine": info, "argv": sys.argv[1:] if argv is None else argv, "rounds": rounds,
            "requests": count, "server": server.command(Path("MODEL"), 8000), "rows": rows,
            "wall_s": round(time.monotonic() - started, 1)}
    table = _common.table(
        ["request", "body (KB)", "price (characters)", "price × 0.36 µs (ms)", "loop CPU (ms)",
         "loop CPU above the text request's (ms)", "that / price × 0.36 µs"],
        [[("short text" if r["kind"] == TEXT else f"one {r['kind']}-pixel JPEG"),
          f"{r['body_bytes'] / 1024:.1f}", f"{r['price']:.0f}", f"{r['price_ms']:.2f}",
          f"{r['loop_cpu_ms']:.2f} [{r['loop_cpu_interval'][0]:.2f}, {r['loop_cpu_interval'][1]:.2f}]",
          "" if r["kind"] == TEXT else f"{r['above_text_ms']:.2f}",
          "" if r["kind"] == TEXT else f"{r['above_text_ms'] / r['price_ms']:.2f}"]
         for r in rows],
    )
    markdown = (
        _common.header("What an image request costs the event loop, against its price", info)
        + f"`python -m benchmarks image-cost {' '.join(data['argv'])}`: one `inline` server (tiny CLIP), "
        f"requests one at a time, {count} of each kind per round, {rounds} rounds in a random order; "
        f"loop CPU per request, median [interval] over {rounds * count} requests; run took {data['wall_s']:.0f} s.\n\n"
        "<!-- --8<-- [start:tables] -->\n" + table + "<!-- --8<-- [end:tables] -->\n"
    )
    _common.write(args.out, "image-cost-smoke" if args.smoke else "image-cost", data, markdown)
    print(f"wrote the results into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
