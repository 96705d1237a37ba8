"""A test seam in vLLM's engine: every request the scheduler takes is written to
`$OFFLOAD_TEST_ENGINE_LOG` as `request_id priority`, one line each, and, with
`$OFFLOAD_TEST_ENGINE_DELAY` (seconds), the engine core spends that long on
taking each one (a busy engine: requests wait there, not in offload).

On the `PYTHONPATH` of a test server only (Python imports `sitecustomize` at
start in every process, the engine core's included). It patches
`vllm.v1.core.sched.scheduler.Scheduler.add_request` when that module is
first imported, so nothing is imported early.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import time
from types import ModuleType
from typing import Any

TARGET = "vllm.v1.core.sched.scheduler"
LOG = os.environ.get("OFFLOAD_TEST_ENGINE_LOG")
DELAY = float(os.environ.get("OFFLOAD_TEST_ENGINE_DELAY") or 0)


def _patch(module: ModuleType) -> None:
    scheduler = module.Scheduler
    original = scheduler.add_request

    def add_request(self: Any, request: Any) -> None:
        if LOG:
            with open(LOG, "a") as log:
                log.write(f"{request.request_id} {request.priority}\n")
        if DELAY:
            time.sleep(DELAY)
        original(self, request)

    scheduler.add_request = add_request


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if LOG or DELAY:
    sys.meta_path.insert(0, _PatchOnImport())
