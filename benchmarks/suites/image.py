"""Library-level multimodal preprocessing: base64 JPEG → CLIP pixel values, under each strategy.

This is the work vLLM's multimodal processor does on the event loop for an image
embedding request (decode, resize, crop, normalise), measured without vLLM: an
asyncio loop with concurrent clients, each request's image processed through the
strategy under test. Per strategy: images/s and the loop's lag.

    python -m benchmarks image            # 224 px CLIP preprocessing, 32 clients
    python -m benchmarks image --smoke
"""

from __future__ import annotations

import asyncio
import base64
import io
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import common as _common
from benchmarks.harness import library, progress
from benchmarks.harness.workloads import jpeg_base64

ROOT = Path(__file__).resolve().parents[2]

def load_processor() -> Any:
    """CLIP's image processor with its defaults (224 px, CLIP mean/std), built without a download."""
    import transformers

    # Pillow backend by name where it exists: vLLM's CPU environment has no torchvision.
    processor_cls = getattr(transformers, "CLIPImageProcessorPil", transformers.CLIPImageProcessor)
    return processor_cls()


def preprocess(b64: str) -> Any:
    from PIL import Image

    image = Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB")
    return library.state()(images=image, return_tensors="np")["pixel_values"].shape


async def serve(executor: Any, images: list[str], clients: int, per_client: int, workers: int) -> dict[str, Any]:
    import offload

    await asyncio.gather(*(executor.run(preprocess, images[0]) for _ in range(workers)))

    async def client(cid: int) -> None:
        for i in range(per_client):
            await executor.run(preprocess, images[(cid + i) % len(images)])

    async with offload.LoopLagMonitor(interval=0.001) as lag:
        start = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(clients)))
        wall = time.perf_counter() - start
    return {"images": clients * per_client, "wall_s": wall, "images_per_s": clients * per_client / wall,
            "lag_p50_ms": lag.p50 * 1e3, "lag_p99_ms": lag.p99 * 1e3, "lag_max_ms": lag.max * 1e3}


def main(argv: list[str] | None = None) -> int:
    p = _common.parser(__doc__ or "", "image")
    p.add_argument("--strategies", nargs="*")
    p.add_argument("--workers", type=int, default=2, help="pool size (default 2: this machine's cores)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    size, clients, per_client = (64, 2, 2) if args.smoke else (512, 32, 4)
    images = [jpeg_base64(size, seed) for seed in range(8)]
    results: dict[str, Any] = {"meta": {**_common.machine(), "mode": "smoke" if args.smoke else "full",
                                        "image_px": size, "clients": clients, "workers": args.workers},
                               "rows": {}}
    names = args.strategies or library.rows()
    with progress.Progress(len(names), "image rows") as bar:
        for name in names:
            executor = library.make_executor(name, args.workers, load_processor)
            try:
                results["rows"][name] = asyncio.run(serve(executor, images, clients, per_client, args.workers))
            finally:
                executor.shutdown()
            bar.step(name)
    body = [[n, f"{r['images_per_s']:.1f}", f"{r['lag_p50_ms']:.2f}", f"{r['lag_p99_ms']:.2f}",
             f"{r['lag_max_ms']:.2f}"] for n, r in results["rows"].items()]
    table = _common.table(["strategy", "images/s", "loop lag p50 ms", "loop lag p99 ms",
                                    "loop lag max ms"], body)
    # The docs page includes the table and its one-line setup (pymdownx.snippets section).
    setup = (f"{clients} clients x {per_client} random {size} px JPEGs (base64) each, decoded and run "
             f"through CLIP's image processor; pool size {args.workers}; {results['meta']['cpus']} CPUs, "
             f"commit `{results['meta']['commit']}`, {results['meta']['date']}.\n\n")
    table = f"{_common.start('tables')}\n{setup}{table}{_common.end('tables')}\n"
    _common.write(args.out, "image_library", results, _common.header("Library-level: image preprocessing (base64 JPEG to CLIP pixel values)", results["meta"]) + table)
    print(f"wrote {args.out / 'image_library'}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
