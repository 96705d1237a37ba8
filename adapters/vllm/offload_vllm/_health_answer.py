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

A server of several API server processes has a board each, side by side in
one memory (`boards`); the answers are the whole server's (`server_liveness`,
`server_readiness`). A board: a header byte saying which of two records is current, a
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
from collections.abc import Callable
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
    """The shared memory the loop writes and the answering process reads: the
    `BOARD_SIZE` bytes of `memory` from `offset` (a server of several API
    server processes has one board each, side by side: `boards`)."""

    def __init__(self, memory: mmap.mmap, offset: int = 0) -> None:
        self.memory = memory
        self.offset = offset

    def write(self, snapshot: Snapshot) -> None:
        """Publish `snapshot` (but its `draining`: `set_draining`). One writer at a time."""
        memory, base = self.memory, self.offset
        current = memory[base + _CURRENT_AT]
        at = base + _RECORDS_AT + (1 - current) * _RECORD.size
        (seq,) = struct.unpack_from("<Q", memory, at)
        error = (snapshot.engine_error or "").encode("utf-8", "replace")[:ERROR_MAX]
        struct.pack_into("<Q", memory, at, seq + 1)
        _RECORD.pack_into(
            memory, at, seq + 1, snapshot.loop_turned_at, snapshot.engine_checked_at, snapshot.max_stall,
            snapshot.refusing, len(error) if snapshot.engine_error is not None else 0xFFFF, error,
        )
        struct.pack_into("<Q", memory, at, seq + 2)
        memory[base + _CURRENT_AT] = 1 - current

    def set_draining(self, draining: bool) -> None:
        """Mark the server draining (or not): one byte, safe from a signal
        handler that interrupts `write`."""
        self.memory[self.offset + _DRAINING_AT] = int(draining)

    def read(self) -> Snapshot:
        """The last record published (a writer is never stopped in the middle of
        both records, so one of them reads whole)."""
        memory, base = self.memory, self.offset
        for attempt in range(64):
            index = memory[base + _CURRENT_AT] ^ (attempt & 1)
            at = base + _RECORDS_AT + index * _RECORD.size
            seq, turned, checked, max_stall, refusing, error_len, error = _RECORD.unpack_from(memory, at)
            if seq & 1 or struct.unpack_from("<Q", memory, at)[0] != seq:
                continue
            return Snapshot(
                turned, checked, max_stall, bool(refusing),
                None if error_len == 0xFFFF else error[:error_len].decode("utf-8", "replace"),
                bool(memory[base + _DRAINING_AT]),
            )
        raise RuntimeError("the health board did not read whole in 64 tries")


def boards(memory: mmap.mmap, count: int) -> list[Board]:
    """The `count` boards of `memory` (`count * BOARD_SIZE` bytes), one per API server process."""
    return [Board(memory, index * BOARD_SIZE) for index in range(count)]


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
    """`(status code, body)` of `GET /ready` at `now`: 503 during shutdown
    (said first: the engine and the loop stop on the way, and that is no
    fault), while liveness fails, and while admission refuses the default
    lane; else 200."""
    code, body = liveness(state, now)
    if state.draining:
        return 503, {**body, "status": "not ready", "reason": "shutting down"}
    if code != 200:
        return code, {**body, "status": "not ready"}
    if state.refusing:
        return 503, {
            **body,
            "status": "not ready",
            "reason": "admission refuses new requests in the default lane (no room for a typical request)",
        }
    return 200, {**body, "status": "ready"}


def _whole(
    states: list[Snapshot], now: float, rule: Callable[[Snapshot, float], tuple[int, dict[str, Any]]]
) -> tuple[int, dict[str, Any]]:
    """`rule` (`liveness` or `readiness`) over the boards of every API server
    process: the first that fails decides (its reason names it where there
    are several), the ages are the oldest, and `api_servers` lists each
    process's status (and reason, where it fails)."""
    answers = [rule(state, now) for state in states]
    if len(answers) == 1:
        return answers[0]
    failing = next(((index, answer) for index, answer in enumerate(answers) if answer[0] != 200), None)
    code, body = answers[0] if failing is None else failing[1]
    body = dict(body)
    for age in ("loop_turned_seconds_ago", "engine_checked_seconds_ago"):
        ages = [answer[1][age] for answer in answers]
        body[age] = None if None in ages else max(ages)
    if failing is not None:
        body["reason"] = f"API server {failing[0] + 1} of {len(answers)}: {body['reason']}"
    body["api_servers"] = [
        {key: value for key, value in answer[1].items() if key in ("status", "reason")} for answer in answers
    ]
    return code, body


def server_liveness(read: list[Board], now: float) -> tuple[int, dict[str, Any]]:
    """`GET /health` of the whole server: `liveness` of every API server process's board."""
    return _whole([board.read() for board in read], now, liveness)


def server_readiness(read: list[Board], now: float) -> tuple[int, dict[str, Any]]:
    """`GET /ready` of the whole server: 503 while any API server process's
    `readiness` is (its loop, the engine, its shutdown, its admission)."""
    return _whole([board.read() for board in read], now, readiness)


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


def answer(head: bytes, read: list[Board]) -> bytes:
    """The whole HTTP/1.1 response (then the connection closes) to a request's
    `head`, from the boards `read` (one per API server process)."""
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
            code, body = server_liveness(read, time.monotonic())
        elif path == "/ready":
            code, body = server_readiness(read, time.monotonic())
        else:
            code, body = 404, {"status": "not found", "paths": list(PATHS)}
    payload = json.dumps(body).encode()
    header = (
        f"HTTP/1.1 {code} {_REASONS[code]}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nCache-Control: no-store\r\nConnection: close\r\n"
    ).encode()
    return header + extra + b"\r\n" + (b"" if line[0] == b"HEAD" else payload)


def serve(listener: socket.socket, read: list[Board], parent_pipe: int, parent: int) -> None:
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
                    _send(ready, answer(received, read))
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
    """`listener_fd board_fd parent_pipe_fd parent_pid [api_servers]`, the
    descriptors inherited; the board holds `api_servers` boards (default 1)."""
    listener_fd, board_fd, parent_pipe, parent, *rest = (int(arg) for arg in argv)
    count = rest[0] if rest else 1
    rise_above_the_server()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    listener = socket.socket(fileno=listener_fd)
    memory = mmap.mmap(board_fd, count * BOARD_SIZE, access=mmap.ACCESS_READ)
    serve(listener, boards(memory, count), parent_pipe, parent)


if __name__ == "__main__":
    main(sys.argv[1:])
