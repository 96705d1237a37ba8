"""Fork safety: a child made by `os.fork()` must not use its parent's workers.

A server that warms its executor up before forking (gunicorn `--preload`,
multiprocessing's `fork` start method) gives every child a copy of the pool's
bookkeeping but none of its threads, and worker processes that belong to the
parent: every call in the child would wait forever. Executors register here,
and in the child each one forgets its workers, so the child's first call
starts fresh ones. Calls that were pending in the parent at the fork belong to
the parent's callers and are forgotten with the rest.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol


class _Forgets(Protocol):
    def _after_fork_in_child(self) -> None: ...


_executors: weakref.WeakSet[_Forgets] = weakref.WeakSet()


def forget_in_child(executor: _Forgets) -> None:
    """Call `executor._after_fork_in_child()` in every child forked from now on."""
    _executors.add(executor)


def _after_fork_in_child() -> None:
    for executor in list(_executors):
        executor._after_fork_in_child()


if hasattr(os, "register_at_fork"):  # pragma: no branch (every POSIX Python)
    os.register_at_fork(after_in_child=_after_fork_in_child)
