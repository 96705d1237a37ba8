"""A loopback HTTP server on threads, for the benchmark harness's tests."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator


def read_head(conn: socket.socket) -> bytes | None:
    """Read up to the end of one request's head; None if the client closed first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    return data


@contextlib.contextmanager
def loopback_server(handle: Callable[[socket.socket], None]) -> Iterator[str]:
    """A loopback server running `handle(conn)` on a thread per connection."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()
