"""One worker process, seen from the parent: start it, talk to it, reap it.

Knows nothing of calls or pools: `_process_slot.py` maps calls onto it.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from typing import Any, final

from .._errors import OffloadError, WorkerCrashed
from .._portable import rebuild_error
from . import _child_main, _wire

#: How long a worker that was asked to stop may take before it is killed.
STOP_GRACE = 5.0


def exit_reason(exitcode: int | None) -> str:
    if exitcode is None:
        return "exited (status unknown)"
    if exitcode < 0:
        try:
            return f"was killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


@final
class WorkerProcess:
    """A started worker process, its pipe, and the shared-memory arenas of both directions.

    Not thread-safe, except `kill`, which any thread may call.
    """

    def __init__(self, process: multiprocessing.process.BaseProcess, conn: Connection) -> None:
        self.process = process
        self.conn = conn
        self.pid = process.pid
        self.tx = _wire.Sender()
        self.rx = _wire.Receiver()
        self.exitcode: int | None = None
        self._reaped = False

    @classmethod
    def spawn(
        cls,
        ctx: BaseContext,
        name: str,
        args: tuple[Any, ...],
        started: Callable[[WorkerProcess], None],
    ) -> WorkerProcess:
        """Start a worker process running `_child_main.main(conn, *args)`;
        `started(worker)` is called as soon as it exists (before its
        initializer ran: whoever may have to kill it meanwhile must know it).
        Raises what prevented it (`OSError`: no pipe, no process)."""
        parent_end, child_end = ctx.Pipe()
        process = ctx.Process(  # type: ignore[attr-defined]
            target=_child_main.main, args=(child_end, *args), name=name
        )
        try:
            process.start()
        except BaseException:
            parent_end.close()
            child_end.close()
            raise
        child_end.close()
        # Every `Process.start()` polls all the children multiprocessing knows
        # of. Under forkserver a poll *reads* the exit status from the
        # sentinel, so another slot's start racing this slot's `join` takes
        # the status and leaves this slot EOF, reported as exit code 255.
        # The slot alone reaps its process.
        multiprocessing.process._children.discard(process)  # type: ignore[attr-defined]
        worker = cls(process, parent_end)
        started(worker)
        return worker

    def wait_ready(self, timeout: float | None) -> None:
        """Wait for the initializer, at most `timeout` seconds (`None`: no
        limit). Raises `WorkerCrashed` if the process died first,
        `InitializerRaised` if the initializer failed, `StartTimedOut` (the
        process killed) if it was not ready in time, or `_wire.StreamBroken`;
        the process is reaped in every case."""
        if not wait([self.conn, self.process.sentinel], timeout):
            # A stuck initializer, or an interpreter that never came up: the
            # process cannot be trusted to answer later.
            self.abandon()
            raise StartTimedOut(f"worker process {self.pid} was not ready within {timeout:g} s")
        try:
            reply = self.receive()
        except WorkerCrashed:
            raise
        except _wire.StreamBroken:
            self.abandon()
            raise
        if reply[0] == "ready":
            return
        if reply[0] == "init-error":
            self.reap()
            raise InitializerRaised(rebuild_error(reply[1]))
        self.abandon()
        raise rebuild_error(reply[1])

    def send(self, data: bytes, buffers: list[Any]) -> None:
        """Send one message. Raises `_wire.ArenaError` (nothing sent) or `OSError`."""
        self.tx.send(self.conn, data, buffers)

    def receive(self) -> Any:
        """The next message from the worker; `WorkerCrashed` if it dies first,
        `_wire.StreamBroken` if its frame could not be read whole (the pipe
        is then out of step: the caller must `abandon` this process)."""
        ready = wait([self.conn, self.process.sentinel])
        if self.conn in ready:
            try:
                message = self.rx.read(self.conn)
            except (EOFError, OSError):
                raise self.crashed() from None
            try:
                return self.rx.decode(message)
            except Exception as exc:
                # The frame arrived whole (the pipe is in step) but the reply
                # cannot be rebuilt here: its class cannot be imported in this
                # process, no memory to copy it, no file descriptor to map it.
                # Only this call fails.
                error = OffloadError(f"the worker's reply could not be unpickled here: {exc!r}")
                error.__cause__ = exc
                return ("error", (error, ""), False)
        raise self.crashed()

    def alive(self) -> bool:
        return not self._reaped and not wait([self.process.sentinel], timeout=0)

    def kill(self) -> None:
        """SIGKILL it now (from any thread); the slot that owns it reaps it."""
        try:
            self.process.kill()
        except (ValueError, OSError):
            pass  # already dead, or being reaped

    def abandon(self) -> None:
        """Kill it at once (its pipe cannot be trusted) and reap it."""
        self.kill()
        self.reap()

    def crashed(self) -> WorkerCrashed:
        """Reap the dead process and describe its death."""
        self.reap()
        return WorkerCrashed(f"worker process {self.pid} {exit_reason(self.exitcode)}")

    def stop(self) -> None:
        """Ask it to exit (an empty message), then reap it."""
        if not self._reaped:
            try:
                self.conn.send_bytes(b"")
            except OSError:
                pass
        self.reap()

    def reap(self) -> None:
        """Wait for it to end (killing it after `STOP_GRACE`), release its pipe,
        arenas and leftover shared-memory files. Idempotent."""
        if self._reaped:
            return
        self._reaped = True
        process = self.process
        process.join(STOP_GRACE)
        if process.exitcode is None:
            process.kill()
            process.join()
        self.exitcode = process.exitcode
        self.conn.close()
        process.close()
        self.tx.close()
        self.rx.close()
        if self.pid is not None:
            _wire.remove_shm_files(_wire.shm_prefix(self.pid))


class StartTimedOut(Exception):
    """The worker did not finish starting in time (the process was killed)."""


class InitializerRaised(Exception):
    """The worker's initializer raised `error` (the process has exited)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error
