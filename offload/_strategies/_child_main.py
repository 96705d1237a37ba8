"""The code that runs inside a `process` worker.

Kept apart from `_process.py` so that a worker imports only what it needs.
Messages (see `_wire`): the parent sends `(fn, args, kwargs)` or an empty
message (stop); the worker answers `("ready",)` once its initializer ran, then one
`("ok", result, retire)` or `("error", (exception, traceback_text), retire)` per
call, where `retire` asks the parent to replace this worker (memory ceiling).
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from .._initializer_state import _NO_STATE, _swap_state
from .._portable import describe_error as _describe_error
from . import _encoding, _wire


def _watch_parent(alive: Connection) -> None:
    # The parent holds the only write end of this pipe: end of file means it
    # died (or dropped the executor), and a worker must not outlive it, even
    # in the middle of a call.
    try:
        alive.recv_bytes()
    except (EOFError, OSError):
        pass
    os._exit(0)


def _send(conn: Connection, tx: _wire.Sender, message: tuple[Any, ...], threshold: int | None) -> None:
    """Send a reply. A reply that cannot be pickled, or whose shared memory
    cannot be made, is replaced by an error reply, so the call still ends.
    Raises `OSError` only if the pipe is broken (the parent is gone)."""
    try:
        data, buffers = _encoding.dumps(message, threshold)
    except Exception as exc:
        if message[0] != "ok":
            raise
        error = TypeError(
            f"the result of the offloaded call ({type(message[1]).__name__}) could not be pickled "
            f"to send it back: {exc}"
        )
        error.__cause__ = exc
        data, buffers = _encoding.dumps(("error", _describe_error(error), message[2]), threshold)
    try:
        tx.send(conn, data, buffers)
    except _wire.ArenaError as exc:
        if message[0] == "init-error":
            raise
        failure = OSError(f"the worker could not send the reply: {exc}")
        failure.__cause__ = exc.__cause__
        tx.send(conn, *_encoding.dumps(("error", _describe_error(failure), message[-1]), None))


def main(
    conn: Connection,
    alive: Connection,
    initializer: Callable[..., Any] | None,
    initargs: tuple[Any, ...],
    threshold: int | None,
    max_memory: int | None,
    nice: int = 0,
) -> None:
    """The worker process's target: initialize, then run calls until told to stop."""
    # Ctrl-C in a terminal reaches the whole process group: the parent decides
    # what happens to the pool (it shuts it down), not each worker on its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if nice:
        # Below the parent: its event loop gets the CPU first (`DEFAULT_NICE`).
        os.nice(nice)
    threading.Thread(target=_watch_parent, args=(alive,), name="offload-parent-watch", daemon=True).start()

    try:
        _serve(conn, initializer, initargs, threshold, max_memory)
    except OSError:
        # The pipe broke: the parent is gone (or gave up on this worker).
        # Nobody is left to tell, so no traceback either.
        return


def _serve(
    conn: Connection,
    initializer: Callable[..., Any] | None,
    initargs: tuple[Any, ...],
    threshold: int | None,
    max_memory: int | None,
) -> None:
    state: Any = _NO_STATE
    if initializer is not None:
        try:
            state = initializer(*initargs)
        except BaseException as exc:
            _send(conn, _wire.Sender(), ("init-error", _describe_error(exc)), None)
            return
    _swap_state(state)
    memory: Callable[[], int] | None = None
    if max_memory is not None:
        import psutil

        memory_info = psutil.Process().memory_info
        memory = lambda: memory_info().rss  # noqa: E731
    conn.send_bytes(pickle.dumps(("ready",)))
    tx, rx = _wire.Sender(), _wire.Receiver()

    while True:
        try:
            message = rx.recv(conn)
        except (EOFError, _wire.StreamBroken):
            # Gone, or out of step with the parent: a reply now could reach the
            # wrong call. Exiting makes the parent fail this one call and replace us.
            return
        except BaseException as exc:
            error = TypeError(f"the worker could not unpickle the call: {exc!r}")
            error.__cause__ = exc
            _send(conn, tx, ("error", _describe_error(error), False), threshold)
            continue
        if message is None:
            return
        fn, args, kwargs = message
        del message
        try:
            result = _encoding.wrap_bytes(fn(*args, **kwargs), threshold)
        except BaseException as exc:
            reply: tuple[Any, ...] = ("error", _describe_error(exc))
        else:
            reply = ("ok", result)
        del fn, args, kwargs
        retire = memory is not None and max_memory is not None and memory() > max_memory
        _send(conn, tx, (*reply, retire), threshold)
        del reply
