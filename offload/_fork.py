"""Fork safety: a child made by `os.fork()` must not use its parent's workers.

A server that warms its executor up before forking (gunicorn `--preload`,
multiprocessing's `fork` start method) gives every child a copy of the pool's
bookkeeping but none of its threads, and worker processes that belong to the
parent: every call in the child would wait forever. Executors register here,
and in the child each one forgets its workers, so the child's first call
starts fresh ones. Calls that were pending in the parent at the fork belong to
the parent's callers and are forgotten with the rest.

Process-wide state that outlives any executor is reset in the child too,
once per fork: here, multiprocessing's forkserver (the parent's child, not
ours) and the lock of its resource tracker; and the state each of offload's
modules registers with `reset_in_child` (the locks of every call's state,
of the shared executors, of the metrics: a thread of the parent may have
held any of them). This is the one place offload hooks `os.fork()`.
"""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Callable
from typing import Any, Protocol


class _Forgets(Protocol):
    def _after_fork_in_child(self) -> None: ...


_executors: weakref.WeakSet[_Forgets] = weakref.WeakSet()


#: What each module of offload resets in a child, in registration order.
_resets: list[Callable[[], None]] = []


def reset_in_child(reset: Callable[[], None]) -> Callable[[], None]:
    """Run `reset()` in every child forked from now on, before the executors
    forget their workers: for a module's own process-wide state (a lock a
    thread of the parent may have held at the fork). A decorator: returns
    `reset`. The module keeps what it resets; this is where `os.fork()` is
    hooked, once for all of them."""
    _resets.append(reset)
    return reset


def forget_in_child(executor: _Forgets) -> None:
    """Call `executor._after_fork_in_child()` in every child forked from now on
    (as long as the executor lives)."""
    _executors.add(executor)


def _reset_forkserver() -> None:
    """In a child: forget the parent's forkserver, which is not our child
    (`waitpid` on it fails here), and its lock, which a thread of the parent
    may have held while starting it. The first worker started here starts a
    server of its own. The standard library resets this only in children it
    starts itself."""
    forkserver = sys.modules.get("multiprocessing.forkserver")
    if forkserver is None:
        return
    server: Any = forkserver._forkserver
    alive_fd, preload = server._forkserver_alive_fd, server._preload_modules
    server.__init__()
    server._preload_modules = preload
    if alive_fd is not None:
        # Our copy would keep the parent's server alive after the parent.
        try:
            os.close(alive_fd)
        except OSError:
            pass


def forget_foreign_forkserver() -> None:
    """Reset multiprocessing's forkserver state if the server it names is not
    this process's child (inherited through a fork whose hooks did not run
    here: offload was imported after it)."""
    forkserver = sys.modules.get("multiprocessing.forkserver")
    if forkserver is None:
        return
    pid = forkserver._forkserver._forkserver_pid
    if pid is None:
        return
    try:
        # WNOWAIT: look without reaping it (multiprocessing reaps its own).
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        _reset_forkserver()


def _reset_resource_tracker_lock() -> None:
    """In a child: a fresh lock for multiprocessing's resource tracker, which
    a thread of the parent may have held at the fork (a slot starting a
    worker: forkserver and spawn both pass through `ensure_running`).

    Held by a thread that does not exist here, the lock would make the
    child's first worker start hang, or fail with `ReentrantCallError`: glibc
    gives the child's first new thread the stack, hence the thread id, of a
    parent's thread that is gone, and the `RLock` takes it for its owner
    coming back. The tracker process itself stays shared with the parent, as
    in any forked child (its pipe is inherited; `ensure_running` probes it).
    """
    resource_tracker = sys.modules.get("multiprocessing.resource_tracker")
    if resource_tracker is None:
        return
    # What `threading` does to its own locks in a child (whichever kind this Python uses here).
    resource_tracker._resource_tracker._lock._at_fork_reinit()


def _after_fork_in_child() -> None:
    for reset in _resets:
        reset()
    _reset_forkserver()
    _reset_resource_tracker_lock()
    for executor in list(_executors):
        executor._after_fork_in_child()


if hasattr(os, "register_at_fork"):  # pragma: no branch (every POSIX Python)
    os.register_at_fork(after_in_child=_after_fork_in_child)
