"""Shared pieces of the library-level benchmarks (no vLLM): strategy rows and result files."""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import json
import os
import platform
from collections.abc import Callable
from pathlib import Path
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


def meta(mode: str) -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()}: {os.cpu_count()} CPUs, {platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "offload": offload.__version__,
        "mode": mode,
        "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def write(out: Path, stem: str, results: dict[str, Any], table: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1))
    (out / f"{stem}.md").write_text(table + "\n")


def markdown_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])
