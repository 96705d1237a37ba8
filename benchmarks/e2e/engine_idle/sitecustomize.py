"""For a benchmark row only: how long vLLM's shared-memory message queue
readers (the model worker waiting for the scheduler's next step, and the
engine core waiting for the worker) keep spinning after a read before they
sleep on a socket, from `$OFFLOAD_BENCH_ENGINE_BUSY_LOOP_S` (seconds; vLLM
spins for 1 s). Every process started with this folder on its `PYTHONPATH`
imports it (Python imports `sitecustomize` at start), and sets that default
once vLLM's module loads. On a GPU host the spinning reader has a core to
itself; on this 2-core host it shares one with the API server, and a row
with 0 measures what that costs the loop. Not a setting of offload's."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

_BUSY_LOOP_S = os.environ.get("OFFLOAD_BENCH_ENGINE_BUSY_LOOP_S")
_MODULE = "vllm.distributed.device_communicators.shm_broadcast"


def _set_default(module: ModuleType, busy_loop_s: float) -> None:
    spin_condition = module.SpinCondition
    init = spin_condition.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["busy_loop_s"] = busy_loop_s
        init(self, *args, **kwargs)

    spin_condition.__init__ = __init__


class _SetAfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, busy_loop_s: float) -> None:
        self._busy_loop_s = busy_loop_s

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        exec_module = loader.exec_module
        busy_loop_s = self._busy_loop_s

        def exec_then_set(module: ModuleType) -> None:
            exec_module(module)
            _set_default(module, busy_loop_s)

        loader.exec_module = exec_then_set
        return spec


if _BUSY_LOOP_S:
    sys.meta_path.insert(0, _SetAfterImport(float(_BUSY_LOOP_S)))
