"""Shared-memory files that outlived the processes which made them."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from .._strategies import _wire


def shm_files(pids: Iterable[int]) -> list[Path]:
    """offload's shared-memory files made by any of the processes `pids`, sorted by name.

    The `process` strategy passes a large payload through a file in the
    shared-memory directory (`/dev/shm`) named after the process that made
    it, and removes it as the process ends cleanly. offload makes these files
    itself, not through `multiprocessing.shared_memory`, so Python's resource
    tracker neither counts nor removes them: one left after its maker ended
    (killed, crashed) stays until reboot. A test that stops processes that
    used offload (a server and its workers) checks with this that none is
    left, and removes those that are (`Path.unlink`). Empty where there is no
    shared-memory directory. Needs no pytest."""
    prefixes = tuple(_wire.shm_prefix(pid) for pid in pids)
    if not prefixes:
        return []
    try:
        names = os.listdir(_wire.SHM_DIR)
    except OSError:
        return []
    return sorted(Path(_wire.SHM_DIR, name) for name in names if name.startswith(prefixes))
