"""Wake an awaiting task from any thread, on asyncio (uvloop included) and trio.

anyio offers blocking portals (`anyio.from_thread`) but no cheap, non-blocking
"wake this task from that thread" primitive; this is the one place that adds
it. A worker must never wait for the event loop, and the usual chain
(`concurrent.futures.Future` + `asyncio.wrap_future`) costs two futures, a
condition variable and two callbacks per call.
"""

from __future__ import annotations

import asyncio
import collections
import os
import threading
import weakref
from collections.abc import Callable
from typing import Protocol

import anyio.lowlevel
import sniffio


class Waiter(Protocol):
    def wake(self) -> None:
        """Wake the waiting task. Callable from any thread, at most once useful."""

    async def wait(self) -> None:
        """Wait until `wake` is called. Cancellable."""


class _Doorbell:
    """Runs callbacks on one asyncio event loop, from any thread, waking the
    loop with `os.write`, which releases the GIL for the system call.

    `loop.call_soon_threadsafe` does the same on the standard library's loops
    (a socket send releases the GIL), but uvloop writes its eventfd holding
    the GIL. On Linux the write may hand the CPU straight to the loop thread
    it wakes, more so when the writer is a worker thread below the loop's
    priority: the loop then wants the GIL, which the preempted writer still
    holds, and waits until that worker gets a CPU again.

    One per loop, made on the loop's thread; `ring` may be called from any
    thread. Callbacks run on the loop in the order rung; they must not raise.
    The pipe is closed with `close`: when the loop is garbage-collected, once
    the loop is closed (`close_doorbells_of_closed_loops`), or in a forked
    child.
    """

    __slots__ = ("__weakref__", "_closed", "_lock", "_loop", "_pending", "_read_fd", "_write_fd")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._pending: collections.deque[Callable[[], None]] = collections.deque()
        self._loop = weakref.ref(loop)
        # Held around the write and the close, so a ring never writes to a
        # descriptor closed (and perhaps reused) since.
        self._lock = threading.Lock()
        self._closed = False
        try:
            loop.add_reader(self._read_fd, self._run_pending)
        except BaseException:
            self.close()
            raise

    def ring(self, callback: Callable[[], None]) -> None:
        """Run `callback` on the loop soon; a no-op once the loop is closed."""
        loop = self._loop()
        if loop is None or loop.is_closed():
            return  # Nobody is waiting any more.
        self._pending.append(callback)
        with self._lock:
            if self._closed:
                return
            try:
                os.write(self._write_fd, b"\0")
            except BlockingIOError:
                pass  # The pipe is full of rings not yet read: the loop will run this one too.

    def _run_pending(self) -> None:
        # Read the rings before taking the callbacks: a ring that comes in
        # between leaves a byte behind, so its callback is never stranded.
        try:
            while os.read(self._read_fd, 4096):
                pass
        except BlockingIOError:
            pass
        pending = self._pending
        while pending:
            pending.popleft()()

    def close(self) -> None:
        """Close the pipe (idempotent). The loop must no longer watch it, or be closed."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.close(self._read_fd)
            os.close(self._write_fd)
        self._pending.clear()


#: Each non-standard loop's doorbell (None where the loop cannot watch a pipe).
#: Read without the lock on the hot path; changed under it.
_doorbells: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Doorbell | None] = weakref.WeakKeyDictionary()
_doorbells_lock = threading.Lock()


def close_doorbells_of_closed_loops() -> None:
    """Close the pipes of loops that are closed but not yet collected (a test
    suite runs many loops). Called when a doorbell is made and when an
    executor shuts down; safe from any thread."""
    with _doorbells_lock:
        closed = [(loop, bell) for loop, bell in list(_doorbells.items()) if loop.is_closed()]
        for loop, _ in closed:
            del _doorbells[loop]
    for _, bell in closed:
        if bell is not None:
            bell.close()


def _doorbell(loop: asyncio.AbstractEventLoop) -> _Doorbell | None:
    """The doorbell of `loop`, made on first use; None for the standard
    library's loops, whose own wake-up releases the GIL, and for a loop that
    cannot watch a file descriptor (then `call_soon_threadsafe` is used)."""
    try:
        return _doorbells[loop]
    except KeyError:
        pass
    close_doorbells_of_closed_loops()
    bell: _Doorbell | None = None
    if not isinstance(loop, asyncio.BaseEventLoop):
        try:
            bell = _Doorbell(loop)
        except NotImplementedError:
            pass
        else:
            weakref.finalize(loop, bell.close)
    with _doorbells_lock:
        _doorbells[loop] = bell
    return bell


def forget_doorbells_in_child() -> None:
    """In a child made by `os.fork()`: close the child's copies of the
    parent's pipes, so that nothing here reads or rings them.

    The loop is not asked to stop watching (`remove_reader`): a loop's epoll
    instance is shared with the parent across the fork, and removing the
    pipe from it here would remove it from the parent's loop, which would
    then never hear its workers again."""
    global _doorbells_lock
    _doorbells_lock = threading.Lock()  # a parent's thread may have held it at the fork
    for bell in list(_doorbells.values()):
        if bell is not None:
            bell._lock = threading.Lock()
            bell.close()
    _doorbells.clear()


class _AsyncioWaiter:
    __slots__ = ("_bell", "_future", "_loop", "_thread")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._future: asyncio.Future[None] = self._loop.create_future()
        self._thread = threading.get_ident()
        self._bell = _doorbell(self._loop)

    def _set(self) -> None:
        if not self._future.done():
            self._future.set_result(None)

    def wake(self) -> None:
        if threading.get_ident() == self._thread:
            self._set()
            return
        if self._bell is not None:
            self._bell.ring(self._set)
            return
        try:
            self._loop.call_soon_threadsafe(self._set)
        except RuntimeError:
            pass  # The loop is closed: nobody is waiting any more.

    async def wait(self) -> None:
        await self._future


class _TrioWaiter:
    __slots__ = ("_event", "_thread", "_token")

    def __init__(self) -> None:
        import trio

        self._token = trio.lowlevel.current_trio_token()
        self._event = trio.Event()
        self._thread = threading.get_ident()

    def wake(self) -> None:
        if threading.get_ident() == self._thread:
            self._event.set()
            return
        import trio

        try:
            self._token.run_sync_soon(self._event.set)
        except trio.RunFinishedError:
            pass  # The run is over: nobody is waiting any more.

    async def wait(self) -> None:
        await self._event.wait()


def current_waiter() -> Waiter:
    """A new waiter bound to the running event loop."""
    if sniffio.current_async_library() == "trio":
        return _TrioWaiter()
    return _AsyncioWaiter()


async def checkpoint_if_cancelled() -> None:
    """Raise the backend's cancellation exception if the calling task is already
    cancelled; otherwise return without yielding (no cost on the hot path).

    `anyio.to_thread.run_sync` and `trio.to_thread.run_sync` check this before
    they hand work to a thread; `Executor.run` does the same, so a call whose
    caller is already cancelled never starts. On asyncio a plain
    `task.cancel()` (no anyio cancel scope) is seen as well.
    """
    await anyio.lowlevel.checkpoint_if_cancelled()
    if sniffio.current_async_library() != "trio":
        task = asyncio.current_task()
        # `cancelling()` (3.11+) counts cancellation requests not yet taken back:
        # one is pending, and the next suspension raises it.
        if task is not None and getattr(task, "cancelling", lambda: 0)():
            await asyncio.sleep(0)
