"""Workers below the event loop's CPU priority (the OS's `nice`).

When every core is busy, the thread running the event loop should get a core
before the workers that run the heavy calls: the loop admits requests,
answers health checks and hands results back, and each of those is short.
The OS gives that to a thread of higher priority, that is, lower niceness.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from ._errors import ConfigError

logger = logging.getLogger("offload")

#: The niceness increment workers get unless told otherwise: 10, the increment
#: `nice` itself applies by default. Why: docs/decisions/0001-workers-below-the-loop-nice-10.md
DEFAULT_NICE = 10
_MAX_NICE = 19

#: Whether threads have a niceness of their own. On Linux each thread is a task
#: with its own niceness, set with `setpriority(PRIO_PROCESS, thread_id)`.
#: Elsewhere niceness belongs to the process, and a thread id given to
#: `setpriority` would name some other process, so it is never tried.
THREADS_HAVE_NICENESS = sys.platform.startswith("linux")

_warned = False


def check_nice(value: object) -> int:
    """Validate a niceness increment: an `int` from 0 to 19 (not a `bool`)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_NICE:
        raise ConfigError(f"nice must be an integer from 0 to {_MAX_NICE}, got {value!r}")
    return value


def lower_this_thread(increment: int) -> None:
    """Add `increment` to the calling thread's niceness (capped at 19).

    Linux only (`THREADS_HAVE_NICENESS`); elsewhere nothing is done. Only this
    thread changes, not the process. Raising niceness needs no privilege; if
    the OS refuses anyway (a sandbox), the first refusal is logged as a
    warning and the thread keeps running at its priority: a worker at the
    loop's priority is slower to yield, never wrong.
    """
    global _warned
    if increment == 0 or not THREADS_HAVE_NICENESS:
        return
    thread_id = threading.get_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, thread_id)
        os.setpriority(os.PRIO_PROCESS, thread_id, min(_MAX_NICE, current + increment))
    except OSError as exc:
        if not _warned:
            _warned = True
            logger.warning("offload: could not lower a worker thread's priority (nice +%d): %s", increment, exc)


def this_thread_niceness() -> int:
    """The calling thread's niceness (on Linux each thread has its own;
    elsewhere the process's). 0 where the OS does not tell."""
    try:
        if THREADS_HAVE_NICENESS:
            return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        return os.getpriority(os.PRIO_PROCESS, 0)
    except (OSError, AttributeError):
        return 0


def set_this_thread_niceness(niceness: int) -> None:
    """Set the calling thread's niceness to `niceness` (Linux only, as
    `lower_this_thread`). Raising it needs no privilege; lowering it does:
    a thread that cannot is left as it is, and the first refusal is logged
    as a warning."""
    global _warned
    if not THREADS_HAVE_NICENESS:
        return
    thread_id = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, thread_id) != niceness:
            os.setpriority(os.PRIO_PROCESS, thread_id, niceness)
    except OSError as exc:
        if not _warned:
            _warned = True
            logger.warning("offload: could not set a worker thread's niceness to %d: %s", niceness, exc)
