"""How worker threads wake a uvloop event loop: the doorbell (`offload/_waiter.py`).

uvloop's `call_soon_threadsafe` writes its eventfd holding the GIL; offload
rings a pipe of its own with `os.write`, which releases it. The standard
library's loops and trio keep their own wake-up, which already releases it.
What the doorbell buys a server is measured by `bench_mixed`'s row `thread
lanes call_soon_threadsafe`; these tests hold its behaviour: every ring runs
once and in order, a full pipe loses nothing, a closed loop or a forked child
keeps no pipe.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time

import anyio
import pytest
import uvloop

import offload
from offload import _waiter

#: Far above any wait here: a test that needs it has hung.
HANG_LIMIT = 60


def _open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_only_loops_outside_the_standard_library_get_a_doorbell() -> None:
    async def bell() -> object:
        return _waiter._doorbell(asyncio.get_running_loop())

    assert isinstance(uvloop.run(bell()), _waiter._Doorbell)
    assert asyncio.run(bell()) is None


def test_a_worker_thread_wakes_uvloop_through_the_doorbell(monkeypatch: pytest.MonkeyPatch) -> None:
    rung = []
    real_ring = _waiter._Doorbell.ring

    def ring(self: _waiter._Doorbell, callback: object) -> None:
        rung.append(threading.current_thread().name)
        real_ring(self, callback)  # type: ignore[arg-type]

    monkeypatch.setattr(_waiter._Doorbell, "ring", ring)

    async def main() -> list[int]:
        with offload.get_executor("thread", max_workers=2) as ex:
            return [await ex.run(sum, [i, 1]) for i in range(20)]

    assert uvloop.run(main()) == [i + 1 for i in range(20)]
    # Each call that finished before its caller waited is set on the loop,
    # without a ring; the others were rung from a worker.
    assert rung
    assert all(name.startswith("offload") for name in rung)


def test_rings_from_many_threads_each_run_once_in_order() -> None:
    async def main() -> dict[int, list[int]]:
        loop = asyncio.get_running_loop()
        bell = _waiter._doorbell(loop)
        assert bell is not None
        seen: dict[int, list[int]] = {t: [] for t in range(4)}
        done = asyncio.Event()
        expected = 4 * 2000

        def ringer(t: int) -> None:
            for i in range(2000):
                bell.ring(functools.partial(record, t, i))

        def record(t: int, i: int) -> None:
            seen[t].append(i)
            if sum(map(len, seen.values())) == expected:
                done.set()

        threads = [threading.Thread(target=ringer, args=(t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        with anyio.fail_after(HANG_LIMIT):
            await done.wait()
        for thread in threads:
            thread.join()
        return seen

    seen = uvloop.run(main())
    assert seen == {t: list(range(2000)) for t in range(4)}


def test_a_full_pipe_loses_no_ring() -> None:
    # The loop thread is kept busy while a thread rings more times than the
    # pipe holds bytes (64 KiB on Linux): the writes beyond that find it
    # full, and every callback must still run once the loop reads.
    rings = 100_000

    async def main() -> int:
        loop = asyncio.get_running_loop()
        bell = _waiter._doorbell(loop)
        assert bell is not None
        count = 0
        done = asyncio.Event()

        def bump() -> None:
            nonlocal count
            count += 1
            if count == rings:
                done.set()

        full = []
        real_write = os.write

        def ringer() -> None:
            for _ in range(rings):
                bell.ring(bump)

        def watching_write(fd: int, data: bytes) -> int:
            try:
                return real_write(fd, data)
            except BlockingIOError:
                full.append(fd)
                raise

        _waiter.os.write = watching_write  # type: ignore[attr-defined]
        try:
            thread = threading.Thread(target=ringer)
            thread.start()
            thread.join(HANG_LIMIT)  # the loop does not run meanwhile
            assert not thread.is_alive()
        finally:
            _waiter.os.write = real_write  # type: ignore[attr-defined]
        assert full, "the pipe never filled: the test did not reach the path it is for"
        with anyio.fail_after(HANG_LIMIT):
            await done.wait()
        await asyncio.sleep(0.05)  # nothing runs twice
        return count

    assert uvloop.run(main()) == rings


def test_a_closed_loop_keeps_no_pipe_once_its_executor_is_shut_down() -> None:
    before = _open_fds()
    bells = []

    async def main() -> None:
        bells.append(_waiter._doorbell(asyncio.get_running_loop()))
        await ex.run(time.sleep, 0.01)

    ex = offload.get_executor("thread", max_workers=1)
    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    bell = bells[0]
    assert bell is not None
    assert _is_open(bell._read_fd)  # the loop object lives on: so would its pipe
    ex.shutdown()
    assert not _is_open(bell._read_fd)
    assert not _is_open(bell._write_fd)
    assert _open_fds() <= before
    bell.ring(lambda: None)  # a late ring of a closed loop's doorbell: no error, nothing written
    assert loop not in _waiter._doorbells
    del loop


def test_the_next_loop_closes_a_closed_loops_pipe() -> None:
    async def bell() -> _waiter._Doorbell | None:
        return _waiter._doorbell(asyncio.get_running_loop())

    first_loop = uvloop.new_event_loop()
    first = first_loop.run_until_complete(bell())
    first_loop.close()
    assert first is not None
    assert _is_open(first._read_fd)
    second = uvloop.run(bell())
    assert second is not None
    assert not _is_open(first._read_fd)
    del first_loop


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_stops_watching_the_parents_pipe() -> None:
    async def main() -> tuple[int, list[int]]:
        bell = _waiter._doorbell(asyncio.get_running_loop())
        assert bell is not None
        with offload.get_executor("thread", max_workers=1) as ex:
            await ex.run(sum, [1])
            pid = os.fork()
            if pid == 0:  # the child: the parent's pipe must be closed here
                ok = not _is_open(bell._read_fd) and not _is_open(bell._write_fd) and not _waiter._doorbells
                os._exit(0 if ok else 1)
            # The parent's loop still hears its workers.
            with anyio.fail_after(HANG_LIMIT):
                results = [await ex.run(sum, [i, 1]) for i in range(50)]
        return pid, results

    pid, results = uvloop.run(main())
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert results == [i + 1 for i in range(50)]
