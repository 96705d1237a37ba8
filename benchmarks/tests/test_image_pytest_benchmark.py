"""pytest-benchmark view of image preprocessing under each strategy: the work
vLLM's multimodal processor does on the event loop for an image embedding
request (base64 JPEG decoded, resized, cropped and normalised to CLIP's 224 px
pixel values), without vLLM: concurrent asyncio clients, each image processed
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


#: Worker processes that import transformers: 55 s for the process row on the
#: shared 2-core machine, over the 120 s that stop a hung test at a higher load.
@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", library.rows())
def test_preprocess_images_under_concurrent_clients(benchmark: Any, loop: asyncio.AbstractEventLoop,
                                                   strategy: str) -> None:
    pytest.importorskip("transformers")
    executor = library.make_executor(strategy, WORKERS, library.load_clip_processor)
    try:
        # Every worker holds its processor before the first timed round.
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
