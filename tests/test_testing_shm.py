"""`offload.testing.shm_files`: the shared-memory files a stopped process left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from offload.testing import shm_files

#: Makes a real arena (a 1 MiB payload through `_wire.Sender`, as a `process`
#: worker sends a large result), says so, and waits to be killed.
_MAKER = """
import pickle, sys, time
from multiprocessing import Pipe
from offload._strategies import _wire

sender = _wire.Sender()
ours, theirs = Pipe()
sender.send(ours, b"", [pickle.PickleBuffer(bytearray(1 << 20))])
print("sent", flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no shared-memory directory")
def test_the_files_of_a_killed_process_are_found_and_can_be_removed() -> None:
    with subprocess.Popen([sys.executable, "-c", _MAKER], stdout=subprocess.PIPE, text=True) as maker:
        try:
            assert maker.stdout is not None
            assert maker.stdout.readline() == "sent\n"
            os.kill(maker.pid, signal.SIGKILL)  # no clean exit: its file stays
        finally:
            maker.kill()
            maker.wait(timeout=60)
    left = shm_files([maker.pid])
    try:
        assert left, "the killed process left no file: the check has nothing to find"
        assert all(path.name.startswith(f"offload-{maker.pid}-") and path.exists() for path in left)
        assert set(left) <= set(shm_files([os.getpid(), maker.pid]))  # any of the pids
    finally:
        for path in left:
            path.unlink()
    assert shm_files([maker.pid]) == []


def test_no_processes_no_files() -> None:
    assert shm_files([]) == []


def test_it_needs_no_pytest() -> None:
    """A server's test harness may call it where the contract suite (pytest) is not wanted."""
    code = "import sys; from offload.testing import shm_files; shm_files([1]); print('pytest' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.stdout.strip() == "False", done.stderr
