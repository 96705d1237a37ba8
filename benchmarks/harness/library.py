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

    def __init__(self, max_workers: int, initializer: Callable[[], Any]) -> None:
        def init() -> None:
            _baseline_state.value = initializer()

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


def make_executor(name: str, workers: int, initializer: Callable[[], Any]) -> Any:
    if name == BASELINE:
        return RunInExecutor(workers, initializer)
    try:
        return offload.get_executor(name, max_workers=workers, initializer=initializer)
    except (offload.ConfigError, TypeError):
        # Strategies without a pool size (inline) take only the initializer.
        return offload.get_executor(name, initializer=initializer)


def rows() -> list[str]:
    return [*offload.STRATEGIES, BASELINE]


def load_clip_processor() -> Any:
    """CLIP's image processor with its defaults (224 px, CLIP mean/std), built without a download."""
    import transformers

    # Pillow backend by name where it exists: vLLM's CPU environment has no torchvision.
    processor_cls = getattr(transformers, "CLIPImageProcessorPil", transformers.CLIPImageProcessor)
    return processor_cls()


def preprocess_image(b64: str) -> tuple[int, ...]:
    """A base64 JPEG through the worker's processor (`load_clip_processor`): its pixel values' shape."""
    import base64
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB")
    shape: tuple[int, ...] = state()(images=image, return_tensors="np")["pixel_values"].shape
    return shape
