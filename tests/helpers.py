"""Module-level functions for tests: the `process` strategy needs them picklable."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import offload


def add(a: int, b: int = 0) -> int:
    return a + b


def identity(x: Any) -> Any:
    return x


def echo_args(*args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return args, kwargs


class CustomError(Exception):
    pass


def raise_custom(message: str) -> None:
    raise CustomError(message)


def raise_value_error(message: str) -> None:
    raise ValueError(message)


def fail_if(x: int, bad: int) -> int:
    if x == bad:
        raise ValueError(f"bad item {x}")
    return x * 2


def sleep_and_return(seconds: float, value: Any = None) -> Any:
    time.sleep(seconds)
    return value


def busy(seconds: float) -> int:
    """Pure-Python loop that holds the GIL for about `seconds`."""
    deadline = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < deadline:
        n += 1
    return n


def worker_identity() -> tuple[int, int]:
    return os.getpid(), threading.get_ident()


def make_state(tag: str) -> dict[str, Any]:
    return {"tag": tag, "pid": os.getpid(), "thread": threading.get_ident(), "calls": 0}


def read_state() -> dict[str, Any]:
    state = offload.worker_state()
    state["calls"] += 1
    return dict(state)


def write_marker(path: str, delay: float = 0.0) -> str:
    time.sleep(delay)
    with open(path, "a") as f:
        f.write("ran\n")
    return path


def hold_slot(directory: str, hold: float) -> int:
    """Mark this call as running (a file in `directory`), count the running calls,
    hold for `hold` seconds, unmark. Works across threads and processes."""
    import uuid

    me = os.path.join(directory, uuid.uuid4().hex)
    with open(me, "w"):
        pass
    try:
        seen = len(os.listdir(directory))
        time.sleep(hold)
        return max(seen, len(os.listdir(directory)))
    finally:
        os.unlink(me)
