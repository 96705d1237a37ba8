"""Module-level functions for the overload and fault-injection tests (picklable
for the `process` strategy)."""

from __future__ import annotations

import os
import time


def gated(gate: str, marker_dir: str, tag: str) -> str:
    """Wait (up to 30 s) until the file `gate` exists, then leave a marker named `tag`."""
    deadline = time.monotonic() + 30
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.002)
    with open(os.path.join(marker_dir, tag), "w"):
        pass
    return tag


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


def square_after(seconds: float, i: int) -> int:
    time.sleep(seconds)
    return i * i


def pid_after(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def hold_until(gate: str, started: str) -> str:
    """Leave the file `started`, then wait (up to 30 s) until the file `gate` exists."""
    with open(started, "w"):
        pass
    deadline = time.monotonic() + 30
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.002)
    return "held"
