"""Module-level functions the contract suite runs (importable by name, so a
strategy whose workers are other processes can run them)."""

from __future__ import annotations

import os
import threading
import time
import uuid
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


def pid() -> int:
    return os.getpid()


def sleep_and_return(seconds: float, value: Any = None) -> Any:
    time.sleep(seconds)
    return value


def write_marker(path: str, delay: float = 0.0) -> str:
    time.sleep(delay)
    with open(path, "a") as f:
        f.write("ran\n")
    return path


def hold_slot(directory: str, hold: float) -> int:
    """Mark this call as running (a file in `directory`), count the running calls,
    hold for `hold` seconds, unmark. Works across threads and processes."""
    me = os.path.join(directory, uuid.uuid4().hex)
    with open(me, "w"):
        pass
    try:
        seen = len(os.listdir(directory))
        time.sleep(hold)
        return max(seen, len(os.listdir(directory)))
    finally:
        os.unlink(me)


def make_state(tag: str) -> dict[str, Any]:
    return {"tag": tag, "pid": os.getpid(), "thread": threading.get_ident(), "calls": 0}


def read_state() -> dict[str, Any]:
    state = offload.worker_state()
    state["calls"] += 1
    return dict(state)


def count_init(directory: str) -> int:
    """Initializer: one line per run in a file named after the worker's pid."""
    with open(os.path.join(directory, str(os.getpid())), "a") as f:
        f.write("init\n")
    return os.getpid()


def fail_init() -> None:
    raise RuntimeError("initializer broke")


def gated(gate: str, marker_dir: str, tag: str) -> str:
    """Wait (up to 30 s) until the file `gate` exists, then leave a marker named `tag`."""
    deadline = time.monotonic() + 30
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.002)
    with open(os.path.join(marker_dir, tag), "w"):
        pass
    return tag


def hold_until(gate: str, started: str) -> str:
    """Leave the file `started`, then wait until the file `gate` exists; after
    30 s raise `TimeoutError` (a test whose gate opened too late fails, rather
    than passing 30 s later)."""
    with open(started, "w"):
        pass
    deadline = time.monotonic() + 30
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{gate} did not appear within 30 s")
        time.sleep(0.002)
    return "held"


def record(path: str, i: int) -> int:
    """Append `i` to `path` (one small O_APPEND write: atomic across processes)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{i}\n".encode())
    finally:
        os.close(fd)
    return i


def mark_then_square_after(started: str, seconds: float, i: int) -> int:
    """Leave the file `started`, then `square_after(seconds, i)`."""
    with open(started, "w"):
        pass
    return square_after(seconds, i)


def mark_then_square_once(started: str, release: str, i: int) -> int:
    """Leave the file `started`, wait (up to a minute) until the file
    `release` exists, then return `i * i`: a call that runs until the test
    lets it end, however slowly the machine gets to the next step."""
    with open(started, "w"):
        pass
    deadline = time.monotonic() + 60.0
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.005)
    return i * i


def square_after(seconds: float, i: int) -> int:
    time.sleep(seconds)
    return i * i


def kill_self(caller: int) -> None:
    """Die by SIGKILL in the middle of the call, unless this is the caller's
    own process (a strategy that wrongly says it replaces crashed workers)."""
    import signal

    if os.getpid() == caller:
        raise RuntimeError("the call runs in the caller's process: it has no worker to kill")
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(30)  # never reached


@offload.make_async(strategy="inline")
def decorated_double(x: int) -> int:
    """`make_async` puts its wrapper under this name: a strategy that sends a
    function to another process by name must still find this function
    (`offload.strategy.by_reference`)."""
    return 2 * x
