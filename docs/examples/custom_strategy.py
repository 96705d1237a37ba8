"""Write your own strategy: a new thread for every call (an illustration, not a pool).

A strategy subclasses `offload.Executor`, sets `name`, and implements two hooks:
`_schedule(call)` hands an `offload.Call` to a worker without blocking, and
`_shutdown(wait, cancel_futures)` stops it. A worker claims the call first
(`call.claim()` is False if its caller was cancelled before it started: the call
must then never run), then runs it (`call.execute()`), which records the outcome
and wakes the awaiting caller. `run`, `submit`, cancellation and the context
managers come from `Executor`.
"""

from __future__ import annotations

import threading
from typing import Any

import anyio

import offload


class ThreadPerCall(offload.Executor):
    name = "thread-per-call"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._stopping = False

    def _schedule(self, call: offload.Call[Any]) -> None:
        def work() -> None:
            try:
                if call.claim():
                    call.execute()
            finally:
                with self._lock:
                    self._threads.discard(thread)

        thread = threading.Thread(target=work, daemon=True)
        with self._lock:  # race-free against _shutdown: nothing starts once it began
            if self._stopping:
                raise offload.ExecutorClosed("ThreadPerCall is shut down")
            self._threads.add(thread)
        thread.start()

    def _shutdown(self, wait: bool, cancel_futures: bool) -> None:
        # No queue here: every call has its thread at once, so `cancel_futures`
        # has nothing to drop (a pool would `call.drop()` its queued calls).
        with self._lock:
            self._stopping = True
            threads = list(self._threads)
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()


def shout(text: str) -> str:
    return text.upper()


async def main() -> None:
    async with ThreadPerCall() as executor:
        loud = offload.make_async(shout, executor=executor)
        print(await loud("hello"))


if __name__ == "__main__":
    anyio.run(main)
