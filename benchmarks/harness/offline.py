"""Offline overhead: `LLM(...).embed()` latency for one short prompt (the seeds' overhead_offline).

Run in its own process per row, because the strategy is chosen when vLLM loads
its plugins:

    OFFLOAD_VLLM_STRATEGY=thread python -m benchmarks.harness.offline MODEL N OUT.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def measure(model: str, n: int) -> dict[str, float]:
    from vllm import LLM

    from benchmarks.harness.load import summarize_ms
    from benchmarks.harness.server import MEMORY_FRACTION
    from benchmarks.harness.workloads import SHORT_TEXT

    llm = LLM(model=model, runner="pooling", dtype="float32", gpu_memory_utilization=MEMORY_FRACTION)
    for _ in range(3):
        llm.embed([SHORT_TEXT], use_tqdm=False)
    latencies = []
    for _ in range(n):
        start = time.perf_counter()
        llm.embed([SHORT_TEXT], use_tqdm=False)
        latencies.append(time.perf_counter() - start)
    return summarize_ms(latencies)


def main(argv: list[str]) -> int:
    model, n, out = argv[0], int(argv[1]), Path(argv[2])
    out.write_text(json.dumps(measure(model, n)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
