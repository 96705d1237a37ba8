"""Fork safety: a child made by `os.fork()` must not use its parent's workers.

A server that warms its executor up before forking (gunicorn `--preload`,
multiprocessing's `fork` start method) gives every child a copy of the pool's
bookkeeping but none of its threads, and worker processes that belong to the
parent: every call in the child would wait forever. Executors register here,
and in the child each one forgets its workers, so the child's first call
starts fresh ones. Calls that were pending in the parent at the fork belong to
the parent's callers and are forgotten with the rest.

Process-wide state that outlives any executor is reset here too, once per
fork: multiprocessing's forkserver (the parent's child, not ours), the lock
of its resource tracker, the locks of offload's metrics, of every call's
state and of the shared executors (a thread of the parent may have held any
of them). Every reset after a fork is here, and nowhere else.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from typing import Any, Protocol


class _Forgets(Protocol):
    def _after_fork_in_child(self) -> None: ...


_executors: weakref.WeakSet[_Forgets] = weakref.WeakSet()


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


def _reset_metric_locks() -> None:
    """In a child: give offload's metrics fresh locks. A thread of the
    parent may have held one (a worker counting a call) at the fork; that
    thread does not exist here, so the lock would never be released and the
    child's first count would hang."""
    from . import _metrics

    _metrics._Families._lock = threading.Lock()
    families = _metrics._Families._instance
    if families is None:
        return
    for family in vars(families).values():
        _fresh_locks(family)
        for child in list(getattr(family, "_metrics", {}).values()):
            _fresh_locks(child)
            for value in vars(child).values():
                for part in value if isinstance(value, list) else (value,):
                    _fresh_locks(part)


def _fresh_locks(obj: object) -> None:
    if isinstance(getattr(obj, "_lock", None), type(threading.Lock())):
        obj._lock = threading.Lock()  # type: ignore[attr-defined]


def _reset_module_locks() -> None:
    """In a child: fresh module-wide locks (every call's state lock, the
    shared executors' lock), which a thread of the parent may have held at
    the fork; none holds them here."""
    from . import _call

    _call._state_lock = threading.Lock()
    # Looked up, not imported: `_decorator` stands above the executor, which imports this.
    decorator: Any = sys.modules.get(f"{__package__}._decorator")
    if decorator is not None:
        decorator._shared_lock = threading.Lock()


def _after_fork_in_child() -> None:
    _reset_module_locks()
    _reset_forkserver()
    _reset_resource_tracker_lock()
    _reset_metric_locks()
    for executor in list(_executors):
        executor._after_fork_in_child()


if hasattr(os, "register_at_fork"):  # pragma: no branch (every POSIX Python)
    os.register_at_fork(after_in_child=_after_fork_in_child)
