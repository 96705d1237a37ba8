"""A measuring helper run in a process of its own while a `with` block runs.

The flood, the `/health` prober and the thread-state sampler each run beside
the client timing the requests, in a spawned process, so that none of them
shares that client's event loop or GIL. They share this lifecycle: start,
wait until the helper says it is ready, run the block, tell it to stop, and
collect the one result it sends back.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from types import TracebackType
from typing import Any

from typing_extensions import Self


class SideProcess:
    """Run `target(*args, ready, stop, out)` in a spawned process from `__enter__`
    to `__exit__`.

    `target` sets the event `ready` once it is under way (`__enter__` waits up
    to `start_timeout` s, then kills it and raises `RuntimeError` naming
    `what`), stops when it sees the event `stop` set, and sends one result on the
    connection `out`. After the block, `result` is that result, or `None` when
    none came within `result_timeout` s or the helper died first (seen at once);
    the process is joined, and killed if it lingers.

    `target` must poll `stop.is_set()`, never sleep in `stop.wait()`: a
    process killed inside `wait()` leaves the event's condition expecting it
    to wake, and `stop.set()` here would then block for good."""

    def __init__(
        self, target: Callable[..., None], args: tuple[Any, ...], *, what: str,
        start_timeout: float, result_timeout: float,
    ) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._ready = ctx.Event()
        self._stop = ctx.Event()
        self._recv, self._send = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=target, args=(*args, self._ready, self._stop, self._send), daemon=True)
        self._what = what
        self._start_timeout = start_timeout
        self._result_timeout = result_timeout
        self.result: Any = None

    @property
    def pid(self) -> int | None:
        """The helper's process id (None before `__enter__`)."""
        return self._proc.pid

    def __enter__(self) -> Self:
        self._proc.start()
        # The child has its own copy now: with none left here, a helper that
        # dies ends the pipe, and `__exit__` sees that at once.
        self._send.close()
        if not self._ready.wait(self._start_timeout):
            self._stop.set()
            self._proc.kill()
            self._proc.join(10)
            self._recv.close()
            raise RuntimeError(f"{self._what} did not start")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        answered = self._recv.poll(self._result_timeout)
        if answered:
            try:
                self.result = self._recv.recv()
            except EOFError:  # the helper died before it sent anything
                pass
        self._recv.close()
        # One that neither answered nor died in time ignored `stop`: waiting
        # for it to end by itself would only add the grace to every such run.
        self._proc.join(10 if answered else 0)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(10)
