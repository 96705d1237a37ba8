"""pytest-benchmark view of image preprocessing under each strategy: the work
vLLM's multimodal processor does on the event loop for an image embedding
request (base64 JPEG decoded, resized, cropped and normalised to CLIP's 224 px
pixel values, `library.clip_pixels`: the array transformers' CLIP processor
gives, checked below), without vLLM: concurrent asyncio clients, each image processed
through the strategy under test, against `loop.run_in_executor`. A round's
loop lag (p50, p99, max, in ms) is in each row's `extra_info`.

`make test` runs these once with `--benchmark-disable`; time them with
`pytest benchmarks/tests/test_image_pytest_benchmark.py --benchmark-enable`
(images/s: CLIENTS x PER_CLIENT over a row's median).
The suite it replaces, and its last committed run (32 clients x 4 images):
`git checkout fa2633e && python -m benchmarks image`,
`git show fa2633e:benchmarks/results/latest/image/image_library.md`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

import offload
from benchmarks.harness import library
from benchmarks.harness.workloads import jpeg_base64

CLIENTS = 16
PER_CLIENT = 2
WORKERS = 2  # the development machine's cores
IMAGES = [jpeg_base64(512, seed) for seed in range(8)]


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_the_pixels_are_the_ones_transformers_clip_processor_gives() -> None:
    """`library.clip_pixels` against transformers' own (the PIL one: vLLM's CPU
    environment has no torchvision), on square and oblong images, smaller and larger than 224 px."""
    import base64
    import io

    import numpy as np
    from PIL import Image

    transformers = pytest.importorskip("transformers")
    processor = getattr(transformers, "CLIPImageProcessorPil", transformers.CLIPImageProcessor)()
    for width, height in ((512, 512), (160, 160), (500, 300), (240, 640)):
        buf = io.BytesIO()
        pixels = np.random.default_rng(width).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels, "RGB").save(buf, format="JPEG", quality=90)
        b64 = base64.b64encode(buf.getvalue()).decode("ascii")
        theirs = processor(images=Image.open(io.BytesIO(buf.getvalue())).convert("RGB"), return_tensors="np")
        np.testing.assert_allclose(library.clip_pixels(b64), theirs["pixel_values"], atol=1e-5)


@pytest.mark.parametrize("strategy", library.rows())
def test_preprocess_images_under_concurrent_clients(benchmark: Any, loop: asyncio.AbstractEventLoop,
                                                   strategy: str) -> None:
    executor = library.make_executor(strategy, WORKERS)
    try:
        # Every worker has imported what it needs before the first timed round.
        async def warm() -> None:
            await asyncio.gather(*(executor.run(library.preprocess_image, IMAGES[0]) for _ in range(WORKERS)))

        loop.run_until_complete(warm())

        async def round_of_clients() -> list[tuple[int, ...]]:
            async def client(cid: int) -> list[tuple[int, ...]]:
                return [await executor.run(library.preprocess_image, IMAGES[(cid + i) % len(IMAGES)]) for i in range(PER_CLIENT)]

            async with offload.LoopLagMonitor(interval=0.001) as lag:
                shapes = await asyncio.gather(*(client(c) for c in range(CLIENTS)))
            benchmark.extra_info.update(lag_p50_ms=lag.p50 * 1e3, lag_p99_ms=lag.p99 * 1e3, lag_max_ms=lag.max * 1e3)
            return [shape for per_client in shapes for shape in per_client]

        shapes = benchmark(lambda: loop.run_until_complete(round_of_clients()))
    finally:
        executor.shutdown()
    # Every image came back as one CLIP input, and the loop's lag was sampled.
    assert shapes == [(1, 3, 224, 224)] * (CLIENTS * PER_CLIENT)
    assert set(benchmark.extra_info) == {"lag_p50_ms", "lag_p99_ms", "lag_max_ms"}
