"""Fixtures the benchmark harness's tests share: a loopback HTTP server whose
paths answer, refuse, drop or hang as a test needs."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from benchmarks.tests.loopback import loopback_server, read_head


@pytest.fixture
def answering_server() -> Iterator[str]:
    """A loopback HTTP server: /ok and /health answer 200, /slow 200 after 0.5 s,
    /close 200 with `Connection: close` and closes, /chunked a chunked 200,
    /busy 503, /retry 503 with `Retry-After: 0.3`, /drop closes the connection unanswered, /hang never answers."""

    def serve(conn: socket.socket) -> None:
        with conn:
            while (data := read_head(conn)) is not None:
                head, _, body = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(body) < length:
                    body += conn.recv(65536)
                path = head.split(b" ")[1]
                if path == b"/drop":
                    return
                if path == b"/slow":
                    time.sleep(0.5)
                if path == b"/close":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}")
                    return
                if path == b"/hang":  # never answers; returns once the client gives up
                    conn.recv(1)
                    return
                if path == b"/retry":
                    conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 0.3\r\nContent-Length: 2\r\n\r\n{}")
                    continue
                if path == b"/chunked":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
                    continue
                status = b"200 OK" if path in (b"/ok", b"/health", b"/slow") else b"503 Service Unavailable"
                conn.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Length: 2\r\n\r\n{}")

    with loopback_server(serve) as url:
        yield url
