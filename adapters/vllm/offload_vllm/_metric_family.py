"""The adapter's own metric families (`_loop_calls.py`, `_phases.py`), each
made once per process, on first use: `prometheus_client` refuses a second
registration of a name in its default registry."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any


def once_per_process(make: Callable[[ModuleType], Any]) -> Callable[[], Any]:
    """A getter of `make(prometheus_client)`, which it calls once (under a
    lock: two threads that first ask at once get the same family). Call the
    getter only where metrics are on (`offload.metrics_enabled()`)."""
    lock = threading.Lock()
    made: list[Any] = []

    def family() -> Any:
        with lock:
            if not made:
                import prometheus_client

                made.append(make(prometheus_client))
            return made[0]

    return family
