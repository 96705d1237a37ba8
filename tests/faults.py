"""Module-level functions for the overload and fault-injection tests (picklable
for the `process` strategy)."""

from __future__ import annotations

import os
import time

# The functions the contract suite runs too: one definition, in offload.testing.
from offload.testing._functions import (  # noqa: F401 (re-exported for the tests)
    gated,
    hold_until,
    square_after,
)


def record(path: str, i: int, seconds: float = 0.0) -> int:
    """Append `i` to `path` (one small O_APPEND write: atomic across processes)."""
    if seconds:
        time.sleep(seconds)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{i}\n".encode())
    finally:
        os.close(fd)
    return i


def pid_after(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


