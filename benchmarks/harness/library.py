"""Shared pieces of the library-level benchmarks (no vLLM): the strategy rows and their executors."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any

import offload

# The naive baseline every comparison keeps: the loop's default thread pool.
BASELINE = "run_in_executor"


class RunInExecutor:
    """`loop.run_in_executor` on a plain pool, with the same initializer, as a strategy row."""

    def __init__(self, max_workers: int, initializer: Callable[[], Any] | None) -> None:
        def init() -> None:
            _baseline_state.value = initializer() if initializer else None

        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers, initializer=init)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class _BaselineState:
    value: Any = None


_baseline_state = _BaselineState()


def state() -> Any:
    """The per-worker object, under an offload strategy or the baseline."""
    try:
        return offload.worker_state()
    except offload.OffloadError:
        return _baseline_state.value


def make_executor(name: str, workers: int, initializer: Callable[[], Any] | None = None) -> Any:
    if name == BASELINE:
        return RunInExecutor(workers, initializer)
    try:
        return offload.get_executor(name, max_workers=workers, initializer=initializer)
    except (offload.ConfigError, TypeError):
        # Strategies without a pool size (inline) take only the initializer.
        return offload.get_executor(name, initializer=initializer)


def rows() -> list[str]:
    return [*offload.STRATEGIES, BASELINE]


#: CLIP's image preprocessing (transformers' `CLIPImageProcessor` defaults): short side to 224 px
#: (bicubic), a centre crop of 224 px, pixels scaled to [0, 1] and normalised by OpenAI CLIP's mean and std.
CLIP_SIZE = 224
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def clip_pixels(b64: str) -> Any:
    """A base64 JPEG as CLIP's pixel values (1, 3, 224, 224): the steps of
    transformers' `CLIPImageProcessorPil`, which gives the same array
    (benchmarks/tests/test_image_pytest_benchmark.py checks it), without its
    import of transformers and torch in every worker process."""
    import base64
    import io

    import numpy as np
    from PIL import Image

    image = Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB")
    width, height = image.size
    long = int(CLIP_SIZE * max(width, height) / min(width, height))
    image = image.resize((CLIP_SIZE, long) if width <= height else (long, CLIP_SIZE), Image.Resampling.BICUBIC)
    left, top = (image.width - CLIP_SIZE) // 2, (image.height - CLIP_SIZE) // 2
    image = image.crop((left, top, left + CLIP_SIZE, top + CLIP_SIZE))
    pixels = (np.asarray(image, dtype=np.float32) / 255 - np.array(CLIP_MEAN, np.float32)) / np.array(CLIP_STD, np.float32)
    return pixels.transpose(2, 0, 1)[None]


def preprocess_image(b64: str) -> tuple[int, ...]:
    """`clip_pixels` in a worker: the pixel values' shape (the array stays there)."""
    shape: tuple[int, ...] = clip_pixels(b64).shape
    return shape
