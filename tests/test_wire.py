"""How arguments and replies cross to a `process` worker (`_encoding`, `_wire`):
out of band, through shared memory or the pipe. A transfer that fails (no file
descriptor, no memory to map or copy, no room in /dev/shm, a broken pipe)
fails its own call only: replies never shift onto later calls, and the next
transfer works."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from typing import Any

import pytest

import offload
from offload._strategies import _encoding, _wire

from . import helpers
from .helpers import TIMEOUT
from .in_subprocess import OFFLOAD_ROOT, ROOT, check, run_python

pytestmark = pytest.mark.anyio


@pytest.fixture
def process_ex() -> Any:
    ex = offload.get_executor("process", max_workers=1)
    yield ex
    ex.shutdown(wait=True, cancel_futures=True)


async def test_worker_out_of_fds_fails_one_call_and_never_shifts_replies(process_ex: offload.Executor) -> None:
    await process_ex.run(helpers.limit_open_files)
    # The worker cannot open the arena of a 1 MiB argument.
    with pytest.raises(Exception, match="Too many open files"):
        await process_ex.run(helpers.identity, b"x" * (1 << 20))
    assert [await process_ex.run(helpers.identity, tag) for tag in "ABC"] == ["A", "B", "C"]


@pytest.mark.parametrize(
    ("threshold", "headroom_mib", "expected"),
    [
        # Through shared memory: the frame arrives whole, only the copy fails.
        ("262144", 96, "could not be unpickled"),
        # Through the pipe, with no room to read the frame itself: the stream
        # is out of step, so the worker must be replaced.
        ("None", 32, "was replaced"),
    ],
    ids=["shared-memory", "pipe"],
)
def test_parent_out_of_memory_for_a_reply_never_shifts_replies(
    threshold: str, headroom_mib: int, expected: str
) -> None:
    # RLIMIT_AS leaves room to map a 64 MiB reply but not to copy it out.
    out = check(
        run_python(
            f"""
            import resource
            import offload
            from tests import helpers

            def vm_size():
                with open("/proc/self/status") as f:
                    for line in f:
                        if line.startswith("VmSize:"):
                            return int(line.split()[1]) * 1024

            if __name__ == "__main__":
                ex = offload.get_executor(
                    "process", max_workers=1, shared_memory_threshold={threshold}
                )
                assert ex.submit(helpers.make_bytes, 1 << 20).result(timeout=60)
                soft, hard = resource.getrlimit(resource.RLIMIT_AS)
                resource.setrlimit(resource.RLIMIT_AS, (vm_size() + ({headroom_mib} << 20), hard))
                try:
                    ex.submit(helpers.make_bytes, 64 << 20).result(timeout=60)
                except MemoryError:
                    print("raw MemoryError")
                except Exception as exc:
                    print("failed:", type(exc).__name__, exc)
                else:
                    print("no failure")
                resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
                print([ex.submit(helpers.identity, t).result(timeout=60) for t in "ABC"])
                ex.shutdown()
            """
        )
    )
    # The limit must have bitten (else this tests nothing), as an OffloadError
    # of that call alone, and later calls get their own replies.
    assert "failed: OffloadError" in out, out
    assert expected in out, out
    assert "['A', 'B', 'C']" in out, out


def test_parent_out_of_fds_fails_the_call_and_leaves_the_worker_alone() -> None:
    out = check(
        run_python(
            """
            import os, resource
            import offload
            from tests import helpers

            if __name__ == "__main__":
                ex = offload.get_executor("process", max_workers=1)
                before = ex.submit(helpers.pid).result(timeout=60)
                lowest_free = os.open(os.devnull, os.O_RDONLY)
                os.close(lowest_free)
                soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
                resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
                try:
                    ex.submit(helpers.identity, b"x" * (1 << 20)).result(timeout=60)
                except Exception as exc:
                    print("error", type(exc).__name__, exc)
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
                print("same worker", ex.submit(helpers.pid).result(timeout=60) == before)
                ex.shutdown()
            """
        )
    )
    assert "error OffloadError" in out, out
    assert "Too many open files" in out
    assert "same worker True" in out


def test_process_pipe_failure_fails_the_call_and_the_pool_recovers() -> None:
    out = check(
        run_python(
            """
            import concurrent.futures, os, resource, signal
            import offload
            from tests import helpers

            if __name__ == "__main__":
                ex = offload.get_executor("process", max_workers=1)
                (pid,) = {ex.submit(helpers.pid).result(timeout=60)}
                os.kill(pid, signal.SIGKILL)  # the next call must start a new worker
                lowest_free = os.open(os.devnull, os.O_RDONLY)
                os.close(lowest_free)
                soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
                resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
                futures = [ex.submit(helpers.add, i) for i in range(3)]
                done, pending = concurrent.futures.wait(futures, timeout=30)
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
                print("pending", len(pending))
                print("errors", sorted({type(f.exception()).__name__ for f in done}))
                print("after", ex.submit(helpers.add, 2, 3).result(timeout=60))
                ex.shutdown(cancel_futures=True)
            """
        )
    )
    assert "pending 0" in out
    # The first call may still find the killed worker and fail with WorkerCrashed.
    assert ("errors ['OffloadError']" in out) or ("errors ['OffloadError', 'WorkerCrashed']" in out), out
    assert "after 5" in out


async def test_a_worker_that_could_not_map_an_argument_maps_the_next_one() -> None:
    ex = offload.get_executor("process", max_workers=1)
    try:
        pid = await ex.run(helpers.pid)
        # Through shared memory: 8 MiB makes an arena the worker maps.
        assert await ex.run(helpers.describe, b"x" * (8 << 20)) == ("bytes", 8 << 20)
        soft = await ex.run(helpers.limit_address_space, 1 << 20)
        # 16 MiB needs a new, larger arena, and no room is left to map it.
        larger = b"y" * (16 << 20)
        with pytest.raises(TypeError, match="could not unpickle the call.*(Cannot allocate|MemoryError|mmap)"):
            await ex.run(helpers.describe, larger)
        await ex.run(helpers.restore_address_space, soft)
        # Memory is back: the same arena maps now (before the fix its file was
        # gone, and every large argument failed with FileNotFoundError), in
        # the same worker.
        for _ in range(2):
            assert await ex.run(helpers.describe, larger) == ("bytes", 16 << 20)
        assert await ex.run(helpers.pid) == pid
    finally:
        await ex.aclose()


def test_a_parent_that_could_not_map_a_reply_maps_the_next_one() -> None:
    out = check(
        run_python(
            """
            import resource
            import offload
            from tests import helpers

            if __name__ == "__main__":
                ex = offload.get_executor("process", max_workers=1)
                # 8 MiB makes an arena this process maps; 16 MiB needs a larger one.
                assert len(ex.submit(helpers.make_bytes, 8 << 20).result(timeout=60)) == 8 << 20
                pid = ex.submit(helpers.pid).result(timeout=60)
                soft, hard = resource.getrlimit(resource.RLIMIT_AS)
                resource.setrlimit(resource.RLIMIT_AS, (helpers.vm_size() + (1 << 20), hard))
                try:
                    ex.submit(helpers.make_bytes, 16 << 20).result(timeout=60)
                except Exception as exc:
                    print("failed:", type(exc).__name__, exc)
                else:
                    print("no failure")
                resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
                for _ in range(3):
                    print("got", len(ex.submit(helpers.make_bytes, 16 << 20).result(timeout=60)))
                print("same worker", ex.submit(helpers.pid).result(timeout=60) == pid)
                ex.shutdown()
            """
        )
    )
    assert "failed: OffloadError" in out, out  # the limit bit
    assert "mmap" in out or "Cannot allocate" in out, out  # it was the map that failed
    assert out.count(f"got {16 << 20}") == 3, out
    assert "same worker True" in out, out


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        probe = subprocess.run(
            ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
            capture_output=True,
            check=False,
            timeout=TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def test_payload_larger_than_free_shm_goes_through_the_pipe() -> None:
    if not _unshare_works():
        pytest.skip("needs `unshare -rm` (a private mount namespace) to shrink /dev/shm")
    script = textwrap.dedent(
        """
        import numpy as np
        import offload
        from tests import helpers

        if __name__ == "__main__":
            with offload.get_executor("process", max_workers=1) as ex:
                array = np.ones(2 << 20)  # 16 MiB, /dev/shm has 8
                print("sent", ex.submit(helpers.describe, array).result(timeout=60))
                back = ex.submit(helpers.make_array, 2 << 20).result(timeout=60)
                print("received", back.nbytes, float(back[-1]))
        """
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(OFFLOAD_ROOT), str(ROOT)])
    result = subprocess.run(
        [
            "unshare", "-rm", "sh", "-c",
            'mount -t tmpfs -o size=8m tmpfs /dev/shm && exec "$0" -c "$1"',
            sys.executable, script,
        ],
        capture_output=True, check=False, text=True, timeout=TIMEOUT, cwd=ROOT, env=env,
    )
    out = check(result)
    assert "sent ('ndarray', 2097152)" in out
    assert f"received {16 << 20} {float((2 << 20) - 1)}" in out


def test_large_bytearray_travels_out_of_band() -> None:
    threshold = _wire.DEFAULT_SHM_THRESHOLD
    _, buffers = _encoding.dumps(_encoding.wrap_bytes(bytearray(1 << 20), threshold), threshold)
    assert len(buffers) == 1


def test_large_bytearray_round_trips_as_bytearray(process_ex: offload.Executor) -> None:
    data = bytearray(os.urandom(1 << 20))
    back = process_ex.submit(helpers.identity, data).result(timeout=TIMEOUT)
    assert type(back) is bytearray
    assert back == data
