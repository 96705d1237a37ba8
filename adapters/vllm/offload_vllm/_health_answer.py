"""The health endpoints' answering process, and the board it reads.

Run as a script (`python -I -S _health_answer.py ...`, by `_health.HealthServer`)
it is a process of its own that answers `GET /health` and `GET /ready` on a
listening socket it inherits, from a *board*: a few bytes of memory shared
with the API server, where the server's event loop publishes its state
(`Board.write`). Imported (`offload_vllm._health`), it gives the server the
board's writer and the answers' rules (`answer`), which the process applies.

Why a process: an answer needs the interpreter's lock (GIL) of whichever
process computes it, and a thread of the API server gets it back, after every
blocking call (accept, receive), only once a thread running Python has used
its switch interval (5 ms): measured on 2 cores beside one thread spinning in
Python, a probe's p50 was 10 ms with `http.server` and still 5.4 ms with a
socket loop of four calls; beside two, p99 34 ms and 30 ms; a child process
answered in p50 0.3 ms, p99 2.7 ms (docs/operations.md). Here nothing of the
API server's interpreter is needed, so no load on it (threads, a long call
holding its GIL) delays an answer, and answering costs the server nothing.

Only the standard library is imported (it runs without `site`, so starts in
tens of ms in a few MB). The process ends when the API server does (the pipe
it holds closes; its parent changes) and ignores SIGINT and SIGTERM, which a
terminal or a process-group kill also sends it: readiness keeps answering
"shutting down" while the server drains.

The board: a header byte saying which of two records is current, a
`draining` byte (set alone, by a signal handler), and two records, each
`seq, loop_turned_at, engine_checked_at, max_stall, refusing, error_len,
error`. The writer (the API server's loop thread) fills the record not
current, its `seq` odd while it writes and even after, then makes it
current; the reader takes the current record, and takes it again (or the
other) when its `seq` was odd or changed while it read.
"""

from __future__ import annotations

import json
import mmap
import os
import select
import signal
import socket
import struct
import sys
import time
from typing import Any

#: One record: seq, loop_turned_at, engine_checked_at, max_stall, refusing, error length, error (UTF-8).
_RECORD = struct.Struct("<Qdddb2xH256s")
_CURRENT_AT = 0
_DRAINING_AT = 1
_RECORDS_AT = 8
BOARD_SIZE = _RECORDS_AT + 2 * _RECORD.size
ERROR_MAX = 256

#: A probe's connection that has not sent its request within this (seconds) is dropped.
REQUEST_TIMEOUT_S = 1.0
#: The most a request's head may take: a probe sends a few hundred bytes.
REQUEST_MAX = 8192
#: How often the process checks that the API server still runs (seconds).
PARENT_CHECK_S = 1.0
#: The process asks for a niceness this much below the API server's (whose
#: loop, engine and the engine's spinning readers run at the server's, its
#: workers 10 above), so that a probe's wake-up comes before theirs when the
#: cores are busy: beside three processes spinning at the server's niceness,
#: a probe's p99 until its answer arrived was 5.7 ms at -10, 9.5 ms at -5,
#: 13.6 ms at 0 (docs/operations.md). Only where the OS lets a process raise
#: its priority (`CAP_SYS_NICE`, `RLIMIT_NICE`); elsewhere it stays at the
#: server's. An answer takes about 10 microseconds: what it may take first is
#: a probe's CPU, and a flood of probes' (the port is for the kubelet).
PRIORITY_ABOVE_SERVER = 10
PATHS = ("/health", "/ready")


class Snapshot:
    """One consistent reading of the board."""

    __slots__ = ("draining", "engine_checked_at", "engine_error", "loop_turned_at", "max_stall", "refusing")

    def __init__(
        self,
        loop_turned_at: float,
        engine_checked_at: float,
        max_stall: float,
        refusing: bool,
        engine_error: str | None,
        draining: bool,
    ) -> None:
        self.loop_turned_at = loop_turned_at
        self.engine_checked_at = engine_checked_at
        self.max_stall = max_stall
        self.refusing = refusing
        self.engine_error = engine_error
        self.draining = draining


class Board:
    """The shared memory the loop writes and the answering process reads."""

    def __init__(self, memory: mmap.mmap) -> None:
        self.memory = memory

    def write(self, snapshot: Snapshot) -> None:
        """Publish `snapshot` (but its `draining`: `set_draining`). One writer at a time."""
        current = self.memory[_CURRENT_AT]
        at = _RECORDS_AT + (1 - current) * _RECORD.size
        (seq,) = struct.unpack_from("<Q", self.memory, at)
        error = (snapshot.engine_error or "").encode("utf-8", "replace")[:ERROR_MAX]
        struct.pack_into("<Q", self.memory, at, seq + 1)
        _RECORD.pack_into(
            self.memory, at, seq + 1, snapshot.loop_turned_at, snapshot.engine_checked_at, snapshot.max_stall,
            snapshot.refusing, len(error) if snapshot.engine_error is not None else 0xFFFF, error,
        )
        struct.pack_into("<Q", self.memory, at, seq + 2)
        self.memory[_CURRENT_AT] = 1 - current

    def set_draining(self, draining: bool) -> None:
        """Mark the server draining (or not): one byte, safe from a signal
        handler that interrupts `write`."""
        self.memory[_DRAINING_AT] = int(draining)

    def read(self) -> Snapshot:
        """The last record published (a writer is never stopped in the middle of
        both records, so one of them reads whole)."""
        for attempt in range(64):
            index = self.memory[_CURRENT_AT] ^ (attempt & 1)
            at = _RECORDS_AT + index * _RECORD.size
            seq, turned, checked, max_stall, refusing, error_len, error = _RECORD.unpack_from(self.memory, at)
            if seq & 1 or struct.unpack_from("<Q", self.memory, at)[0] != seq:
                continue
            return Snapshot(
                turned, checked, max_stall, bool(refusing),
                None if error_len == 0xFFFF else error[:error_len].decode("utf-8", "replace"),
                bool(self.memory[_DRAINING_AT]),
            )
        raise RuntimeError("the health board did not read whole in 64 tries")


def liveness(state: Snapshot, now: float) -> tuple[int, dict[str, Any]]:
    """`(status code, body)` of `GET /health` at `time.monotonic()` `now`:
    200 while the loop turned within `max_stall` and the engine's last check
    found it alive, else 503 with the reason."""
    stalled = now - state.loop_turned_at
    body: dict[str, Any] = {
        "loop_turned_seconds_ago": round(stalled, 3),
        "engine_checked_seconds_ago": round(now - state.engine_checked_at, 3) if state.engine_checked_at else None,
    }
    if stalled > state.max_stall:
        reason = f"the event loop has not turned for {stalled:.1f}s (bound {state.max_stall:g}s)"
    elif state.engine_error is not None:
        reason = f"the engine is not alive: {state.engine_error}"
    else:
        return 200, {"status": "ok", **body}
    return 503, {"status": "unhealthy", "reason": reason, **body}


def readiness(state: Snapshot, now: float) -> tuple[int, dict[str, Any]]:
    """`(status code, body)` of `GET /ready` at `now`: 503 while liveness fails,
    during shutdown, and while admission refuses the default lane; else 200."""
    code, body = liveness(state, now)
    if code != 200:
        return code, {**body, "status": "not ready"}
    if state.draining:
        return 503, {**body, "status": "not ready", "reason": "shutting down"}
    if state.refusing:
        return 503, {
            **body,
            "status": "not ready",
            "reason": "admission refuses new requests in the default lane (no room for a typical request)",
        }
    return 200, {**body, "status": "ready"}


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


def answer(head: bytes, board: Board) -> bytes:
    """The whole HTTP/1.1 response (then the connection closes) to a request's `head`."""
    line = head.split(b"\r\n", 1)[0].split(b" ")
    extra = b""
    body: dict[str, Any]
    if len(line) != 3 or not line[2].startswith(b"HTTP/"):
        code, body = 400, {"status": "bad request"}
    elif line[0] not in (b"GET", b"HEAD"):
        code, body, extra = 405, {"status": "method not allowed"}, b"Allow: GET, HEAD\r\n"
    else:
        path = line[1].split(b"?", 1)[0].decode("latin-1")
        if path == "/health":
            code, body = liveness(board.read(), time.monotonic())
        elif path == "/ready":
            code, body = readiness(board.read(), time.monotonic())
        else:
            code, body = 404, {"status": "not found", "paths": list(PATHS)}
    payload = json.dumps(body).encode()
    header = (
        f"HTTP/1.1 {code} {_REASONS[code]}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nCache-Control: no-store\r\nConnection: close\r\n"
    ).encode()
    return header + extra + b"\r\n" + (b"" if line[0] == b"HEAD" else payload)


def serve(listener: socket.socket, board: Board, parent_pipe: int, parent: int) -> None:
    """Answer on `listener` until `parent_pipe` closes or the parent changes.

    One thread, every connection non-blocking in one `select`: a client that
    sends nothing holds up no other probe, and is dropped after
    `REQUEST_TIMEOUT_S`."""
    listener.setblocking(False)
    pending: dict[socket.socket, tuple[bytes, float]] = {}
    next_check = time.monotonic() + PARENT_CHECK_S
    while True:
        now = time.monotonic()
        timeout = min([next_check, *(deadline for _, deadline in pending.values())]) - now
        waited: list[Any] = [listener, parent_pipe, *pending]
        readable, _, _ = select.select(waited, [], [], max(0.0, timeout))
        now = time.monotonic()
        if parent_pipe in readable or (now >= next_check and os.getppid() != parent):
            return
        if now >= next_check:
            next_check = now + PARENT_CHECK_S
        for ready in readable:
            if ready is listener:
                try:
                    connection, _ = listener.accept()
                except OSError:  # the client left before we took it
                    continue
                connection.setblocking(False)
                pending[connection] = (b"", now + REQUEST_TIMEOUT_S)
            elif isinstance(ready, socket.socket):
                received, deadline = pending.pop(ready)
                try:
                    chunk = ready.recv(REQUEST_MAX)
                except OSError:
                    chunk = b""
                received += chunk
                if chunk and b"\r\n\r\n" not in received and len(received) < REQUEST_MAX:
                    pending[ready] = (received, deadline)
                    continue
                if chunk:
                    _send(ready, answer(received, board))
                ready.close()
        for connection, (_, deadline) in list(pending.items()):
            if deadline <= now:
                del pending[connection]
                connection.close()


def _send(connection: socket.socket, response: bytes) -> None:
    # A response is a few hundred bytes: the socket's buffer takes it whole.
    try:
        connection.setblocking(True)
        connection.settimeout(REQUEST_TIMEOUT_S)
        connection.sendall(response)
    except OSError:  # the probe hung up: no one to tell
        return


def rise_above_the_server() -> int:
    """Lower this process's niceness by `PRIORITY_ABOVE_SERVER` where the OS
    allows it; its niceness after."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, max(-20, current - PRIORITY_ABOVE_SERVER))
    except OSError:  # not allowed: it runs at the server's priority, above the workers'
        pass
    return os.getpriority(os.PRIO_PROCESS, 0)


def main(argv: list[str]) -> None:
    """`listener_fd board_fd parent_pipe_fd parent_pid`, all inherited."""
    listener_fd, board_fd, parent_pipe, parent = (int(arg) for arg in argv)
    rise_above_the_server()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    listener = socket.socket(fileno=listener_fd)
    board = Board(mmap.mmap(board_fd, BOARD_SIZE, access=mmap.ACCESS_READ))
    serve(listener, board, parent_pipe, parent)


if __name__ == "__main__":
    main(sys.argv[1:])
