"""Module-level functions for tests (the `process` strategy needs them
picklable), and the tests' own waits."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import anyio

import offload

# The functions the contract suite runs too: one definition, in offload.testing.
from offload.testing._functions import (  # noqa: F401 (re-exported for the tests)
    CustomError,
    add,
    count_init,
    echo_args,
    fail_init,
    hold_slot,
    identity,
    make_state,
    pid,
    raise_custom,
    raise_value_error,
    read_state,
    sleep_and_return,
    write_marker,
)

#: Generous: bounds a wait that hangs on a regression; it measures nothing.
TIMEOUT = 60


def fail_if(x: int, bad: int) -> int:
    if x == bad:
        raise ValueError(f"bad item {x}")
    return x * 2


def busy(seconds: float) -> int:
    """Pure-Python loop that holds the GIL for about `seconds`."""
    deadline = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < deadline:
        n += 1
    return n


def worker_identity() -> tuple[int, int]:
    return os.getpid(), threading.get_ident()


# ---- for the process strategy ------------------------------------------------


def block_forever(directory: str) -> None:
    """Announce this worker's pid, then never return (a stuck initializer)."""
    with open(os.path.join(directory, str(os.getpid())), "w"):
        pass
    threading.Event().wait()


class BlocksWhenUnpickled:
    """Unpickling it announces the pid and blocks forever: a worker given one
    in its start arguments never reaches its main function."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return block_forever, (self.directory,)


def write_pid_and_sleep(directory: str, seconds: float) -> int:
    """Announce this worker's pid (a file named after it), then hold the call."""
    with open(os.path.join(directory, str(os.getpid())), "w"):
        pass
    time.sleep(seconds)
    return os.getpid()


def kill_self(directory: str) -> None:
    """Record this worker's pid, then die by SIGKILL in the middle of the call."""
    import signal

    with open(os.path.join(directory, str(os.getpid())), "w"):
        pass
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(30)  # never reached


def exit_abruptly(code: int) -> None:
    os._exit(code)


def segfault() -> None:
    import ctypes

    ctypes.string_at(0)


def state_and_pid() -> tuple[Any, int]:
    return offload.worker_state(), os.getpid()


def rss_and_pid() -> tuple[int, int]:
    import psutil

    return psutil.Process().memory_info().rss, os.getpid()


_leaked: list[bytearray] = []


def leak(megabytes: int) -> int:
    """Keep `megabytes` MiB alive in this worker (touched, so it counts in RSS)."""
    block = bytearray(megabytes << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    _leaked.append(block)
    return os.getpid()


def return_unpicklable() -> Any:
    return threading.Lock()


class UnpicklableError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


def raise_unpicklable(message: str) -> None:
    raise UnpicklableError(message)


def make_array(n: int) -> Any:
    import numpy as np

    return np.arange(n, dtype=np.float64)


def make_bytes(n: int) -> bytes:
    return bytes(range(256)) * (n // 256)


def describe(value: Any) -> tuple[str, int]:
    """What arrived in the worker: its type name and a checksum-like size."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return "ndarray", int(value.sum())
    return type(value).__name__, len(value)


class ArrivesBroken:
    """Pickles fine, fails to unpickle (its rebuild function raises)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return raise_value_error, ("cannot rebuild",)


def return_arrives_broken() -> ArrivesBroken:
    return ArrivesBroken()


#: Lazy: no process starts until the decorated function below is first called.
DECORATOR_EXECUTOR: Any = offload.get_executor("process", max_workers=1)


@offload.make_async(executor=DECORATOR_EXECUTOR)
def doubled_in_a_process(x: int) -> tuple[int, int]:
    """`make_async` puts its wrapper under this name; the worker must still find the function."""
    return 2 * x, os.getpid()


# ---- for the tests of failures (rlimits, deep tracebacks, initializers) ----------


def limit_open_files() -> int:
    """In this worker, allow no new file descriptor (soft `RLIMIT_NOFILE` at the
    lowest free one). Returns that limit."""
    import resource

    lowest_free = os.open(os.devnull, os.O_RDONLY)
    os.close(lowest_free)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
    return lowest_free


def recurse_then_raise(depth: int) -> None:
    if depth > 0:
        recurse_then_raise(depth - 1)
    raise ValueError(f"bottom of {depth}")


def recurse_forever(n: int = 0) -> int:
    return recurse_forever(n + 1) + 1


#: Holds `wait_gate` calls (in-process strategies only) until a test sets it.
GATE = threading.Event()


def wait_gate() -> str:
    GATE.wait(60)
    return "gate"


#: Holds `fail_after_gate` until a test sets it.
INIT_GATE = threading.Event()


def fail_after_gate() -> None:
    """Initializer: wait for the test, then fail."""
    INIT_GATE.wait(60)
    raise RuntimeError("initializer broke after the gate")


class Ambiguous:
    """Hashable, but its `==` raises, as a torch tensor's truth value does."""

    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("Boolean value of Ambiguous is ambiguous")


def tag_item(item: Any, k: Any = None) -> tuple[Any, Any]:
    return item, k


def tag_items(items: list[Any], k: Any = None) -> list[tuple[Any, Any]]:
    return [(item, k) for item in items]


#: Set while `SlowToPickle` is being pickled (in this process).
PICKLING = threading.Event()


class SlowToPickle:
    """Takes a while to pickle, so a call can be cancelled after it was claimed
    and before it reaches its worker."""

    def __reduce__(self) -> tuple[Any, ...]:
        PICKLING.set()
        time.sleep(1.0)
        return int, (0,)


def mark(path: str, *_: Any) -> str:
    with open(path, "a") as f:
        f.write("ran\n")
    return path


class TaggedError(Exception):
    def __init__(self, tag: int) -> None:
        super().__init__(tag)
        self.tag = tag


def tagged(tag: int, fail: bool, delay: float) -> tuple[str, int]:
    """Returns or raises something that names `tag`, after `delay` seconds."""
    if delay:
        time.sleep(delay)
    if fail:
        raise TaggedError(tag)
    return "result", tag


def tag_bytes(tag: int, size: int) -> bytes:
    """`size` bytes that only call `tag` would send or return."""
    return tag.to_bytes(4, "little") * (size // 4)


def tagged_payload(tag: int, fail: bool, delay: float, payload: bytes) -> bytes:
    """Check that `payload` is this call's own, then return it (both ways
    through shared memory when it is large)."""
    if payload != tag_bytes(tag, len(payload)):
        raise AssertionError(f"call {tag} received another call's payload")
    tagged(tag, fail, delay)
    return payload


def fail_first_time(directory: str) -> str:
    """An initializer that raises the first time it runs (across processes:
    the first run leaves a file in `directory`), then succeeds."""
    marker = os.path.join(directory, "initialized-once")
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return "state"
    os.close(fd)
    raise CustomError("the first start fails")


def slow_after_first(directory: str, seconds: float) -> int:
    """An initializer that is quick the first time and takes `seconds` every
    later time (runs counted in `directory`, across processes)."""
    runs = len(os.listdir(directory))
    with open(os.path.join(directory, f"run-{os.getpid()}-{runs}"), "w"):
        pass
    if runs:
        time.sleep(seconds)
    return runs


def vm_size() -> int:
    """This process's virtual memory size, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def limit_address_space(headroom: int) -> int:
    """In this worker, allow only `headroom` more bytes of address space
    (soft `RLIMIT_AS`); returns the old soft limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm_size() + headroom, hard))
    return soft


def restore_address_space(soft: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (soft, resource.getrlimit(resource.RLIMIT_AS)[1]))


def starve_address_space(seconds: float) -> None:
    """In this worker, leave almost no address space to grow into for
    `seconds` (a new shared-memory arena cannot be mapped, a large buffer not
    copied), then give it back."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    timer = threading.Timer(seconds, resource.setrlimit, (resource.RLIMIT_AS, (soft, hard)))
    timer.daemon = True
    timer.start()
    resource.setrlimit(resource.RLIMIT_AS, (vm_size() + (2 << 20), hard))


def own_niceness() -> int:
    """The calling thread's niceness (on Linux each thread has its own; in a
    worker process, its main thread's)."""
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def wait_for_file(path: str, timeout: float = 60.0) -> str:
    """Hold the call until `path` exists (a gate that works across processes)."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.005)
    return "released"


def where_and_niceness() -> tuple[int, str, int]:
    """(pid, thread name, niceness) of the worker running the call."""
    return os.getpid(), threading.current_thread().name, own_niceness()


async def wait_until(predicate: Any, seconds: float = 30.0) -> None:
    """Wait in the event loop until `predicate()` (state that other threads
    and processes change) is true; fail after `seconds`."""
    with anyio.fail_after(seconds):
        while not predicate():  # noqa: ASYNC110 (state other threads and processes change)
            await anyio.sleep(0.005)


def fork_a_child_that_calls(ex: offload.Executor) -> int:
    """Fork; the child writes what `ex` answers for `add(20, 22)` ("child got
    42") or how the call failed to stdout, and exits 0 only if it was answered
    (killed by SIGALRM after a minute if it hangs). Returns the child's pid."""
    import signal
    import sys

    child = os.fork()
    if child == 0:
        signal.alarm(60)
        code = 1
        try:
            sys.stdout.write(f"child got {ex.submit(add, 20, 22).result(30)}\n")
            code = 0
        except BaseException as exc:
            sys.stdout.write(f"child failed: {exc!r}\n")
        finally:
            sys.stdout.flush()
            os._exit(code)
    return child
