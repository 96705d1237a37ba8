"""Wake an awaiting task from any thread, on asyncio (uvloop included) and trio.

anyio offers blocking portals (`anyio.from_thread`) but no cheap, non-blocking
"wake this task from that thread" primitive; this is the one place that adds
it. A worker must never wait for the event loop, and the usual chain
(`concurrent.futures.Future` + `asyncio.wrap_future`) costs two futures, a
condition variable and two callbacks per call.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Protocol

import anyio.lowlevel
import sniffio


class Waiter(Protocol):
    def wake(self) -> None:
        """Wake the waiting task. Callable from any thread, at most once useful."""

    async def wait(self) -> None:
        """Wait until `wake` is called. Cancellable."""


class _AsyncioWaiter:
    __slots__ = ("_future", "_loop", "_thread")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._future: asyncio.Future[None] = self._loop.create_future()
        self._thread = threading.get_ident()

    def _set(self) -> None:
        if not self._future.done():
            self._future.set_result(None)

    def wake(self) -> None:
        if threading.get_ident() == self._thread:
            self._set()
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
