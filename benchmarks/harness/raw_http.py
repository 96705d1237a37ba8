"""HTTP/1.1 on a plain socket that reads when each answer reached it, by the kernel's clock.

A client on the same cores as the server, once answered, may wait for a CPU
before it reads the answer; a latency it times includes that wait, which is
not the server's. Linux stamps each packet as it is received
(`SO_TIMESTAMPNS`), and `recvmsg` hands the stamp of the last packet read
over with the data: the time from just before sending until that stamp is
the server's time and the network's, whenever the client then ran.
(Client libraries such as aiohttp read with `recv`, which drops the stamp.)

Only what the benchmarks' servers answer is read: a status line, headers and
a `Content-Length` body; anything else (a chunked body) is an error.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
import urllib.parse
from dataclasses import dataclass

# Linux's SO_TIMESTAMPNS (35), where Python does not name it; a timespec of two int64.
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESTAMP_SPACE = socket.CMSG_SPACE(16)


@dataclass(frozen=True)
class Answer:
    status: int
    #: Whether the server will close the connection after this answer.
    closes: bool
    #: Wall-clock time (s, `time.time()`) the answer's last byte reached the
    #: socket, or None where the kernel gave no stamp (it turns stamping on a
    #: moment after the first socket asks).
    arrived: float | None


def connect(url: str, timeout: float) -> socket.socket:
    """A connection to `url`'s host and port, without Nagle's delay, asking the kernel for receive stamps."""
    parsed = urllib.parse.urlsplit(url)
    sock = socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 80), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    return sock


def request_bytes(method: str, url: str, body: bytes = b"", content_type: str = "application/json") -> bytes:
    """One HTTP/1.1 request for `url` (keep-alive), with `body` if any."""
    parsed = urllib.parse.urlsplit(url)
    target = (parsed.path or "/") + (f"?{parsed.query}" if parsed.query else "")
    head = f"{method} {target} HTTP/1.1\r\nHost: {parsed.netloc}\r\n"
    if body:
        head += f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def read_answer(sock: socket.socket) -> Answer:
    """Read one HTTP response from `sock`. Raises `ConnectionError` if the
    server closes the connection first, `ValueError` for a response this does
    not read (no status line, a chunked body), `OSError` on a socket error or
    timeout."""
    data, arrived = b"", None
    while True:
        chunk, ancillary, _, _ = sock.recvmsg(65536, _TIMESTAMP_SPACE)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        data += chunk
        for level, kind, value in ancillary:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS:
                seconds, nanoseconds = struct.unpack("qq", value[:16])
                arrived = seconds + nanoseconds / 1e9
        head, found, body = data.partition(b"\r\n\r\n")
        if not found:
            continue
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
            raise ValueError(f"not an HTTP status line: {lines[0][:80]!r}")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        if b"chunked" in headers.get(b"transfer-encoding", b""):
            raise ValueError("a chunked body: only Content-Length bodies are read")
        if len(body) >= int(headers.get(b"content-length", b"0")):
            return Answer(int(parts[1]), headers.get(b"connection") == b"close", arrived)


def exchange(sock: socket.socket, request: bytes) -> tuple[Answer, float]:
    """Send `request` and read its answer: the answer, and the wall-clock time
    (`time.time()`) just before sending, so that `answer.arrived - sent` is the
    time until the answer arrived."""
    sent = time.time()
    sock.sendall(request)
    return read_answer(sock), sent
