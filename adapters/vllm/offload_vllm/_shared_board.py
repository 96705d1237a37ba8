"""How the API server processes of one server share the health port's boards.

With `--api-server-count N` vLLM runs N API server processes, siblings (its
serve process starts them all). The health port is the whole server's, so
one of them holds it: the first (vLLM's index 0) makes the memory of N
boards (`_health_answer.boards`), binds the port and starts the answering
process, which reads all N; each other process publishes into its own board
there. They meet on a Unix socket in Linux's abstract namespace, named by
the server (the parent they share, and the port): index 0 listens
(`BoardHost`), each other process connects, says its index, and is handed
the memory's file descriptor (`SCM_RIGHTS`; `join`). Nothing is on a file
system, so nothing is left behind however a process ends; the socket hands
the memory only to a process of the same user and the same parent
(`SO_PEERCRED`), as an abstract socket has no permissions of its own.

Linux only (abstract sockets, `/proc`): elsewhere the health port is
refused with more than one API server process (`_health.refuse_beside_api_servers`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import sys
import threading
import time
from typing import Final, final

logger = logging.getLogger("vllm.offload_vllm")

#: Whether this platform has what the API server processes meet with.
SUPPORTED: Final = sys.platform.startswith("linux")

#: How often a process retries while the first has not listened yet.
JOIN_RETRY_S = 0.1
#: A process not joined after this many seconds says so in the log, once (it keeps trying).
JOIN_WARN_S = 60.0
#: The most an exchange on an accepted connection may take.
EXCHANGE_TIMEOUT_S = 5.0

_UCRED = struct.Struct("3i")


def rendezvous_name(port: int, parent: int | None = None) -> str:
    """The abstract socket's name for the server whose API servers have the
    parent `parent` (default: this process's) and whose health port is `port`."""
    return f"\0offload-vllm-health-{os.getppid() if parent is None else parent}-{port}"


def parent_of(pid: int) -> int | None:
    """`pid`'s parent, from `/proc` (`None` when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1])


@final
class BoardHost:
    """The first API server process's side: hands the boards' memory
    (`memory_fd`) to each other process of the server that asks, from a
    thread blocked in `accept` (it wakes once per process that joins)."""

    def __init__(self, memory_fd: int, count: int, port: int) -> None:
        """Listens now; raises `OSError` when the name is taken (another server
        of the same parent and port: that one's first process holds it)."""
        self._memory_fd = memory_fd
        self._count = count
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._listener.bind(rendezvous_name(port))
            self._listener.listen(max(8, count))
        except OSError:
            self._listener.close()
            raise
        #: The indices handed the memory so far.
        self.joined: set[int] = set()
        self._closing = False
        self._thread = threading.Thread(target=self._serve, name="offload-vllm-health-boards", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closing:
            try:
                connection, _ = self._listener.accept()
            except OSError:  # closed
                return
            with connection:
                try:
                    self._exchange(connection)
                except OSError as exc:
                    logger.warning("offload-vllm: an API server process could not join the health port: %s", exc)

    def _exchange(self, connection: socket.socket) -> None:
        connection.settimeout(EXCHANGE_TIMEOUT_S)
        pid, uid, _ = _UCRED.unpack(connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
        if uid != os.getuid() or parent_of(pid) != os.getppid():
            logger.warning("offload-vllm: refused the health boards to pid %d, not an API server of this server", pid)
            connection.sendall(b"refused: not an API server process of this server\n")
            return
        said = connection.recv(64).strip()
        index = int(said) if said.isdigit() else -1
        if not 0 < index < self._count:
            connection.sendall(f"refused: index {said.decode(errors='replace')} is not 1..{self._count - 1}\n".encode())
            return
        self.joined.add(index)  # before: the process may publish as soon as it has the memory
        try:
            socket.send_fds(connection, [b"ok\n"], [self._memory_fd])
        except OSError:
            self.joined.discard(index)
            raise

    def close(self) -> None:
        self._closing = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(timeout=5)


def join(port: int, index: int) -> int:
    """Another API server process's side: the boards' memory's file
    descriptor, from the first process, asked for as API server `index`;
    tried again every `JOIN_RETRY_S` until that process listens (warned
    about once after `JOIN_WARN_S`; a daemon thread of the caller's waits
    here, for as long as the process lives). Raises `RuntimeError` when the
    first process refuses."""
    began = time.monotonic()
    warned = False
    while True:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            try:
                connection.connect(rendezvous_name(port))
                connection.settimeout(EXCHANGE_TIMEOUT_S)
                connection.sendall(f"{index}\n".encode())
                message, fds, _, _ = socket.recv_fds(connection, 256, 1)
            except (ConnectionRefusedError, FileNotFoundError, TimeoutError, ConnectionResetError):
                message, fds = b"", []
            if fds:
                return fds[0]
            if message.startswith(b"refused"):
                raise RuntimeError(f"the health port's first API server process {message.decode().strip()}")
        if not warned and time.monotonic() - began > JOIN_WARN_S:
            warned = True
            logger.warning(
                "offload-vllm: API server %d has not joined the health port after %.0fs (the first API server "
                "process does not listen yet); it keeps trying, and the port reports it unhealthy meanwhile",
                index + 1, JOIN_WARN_S,
            )
        time.sleep(JOIN_RETRY_S)
