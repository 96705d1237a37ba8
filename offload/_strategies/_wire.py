"""How messages cross the pipe between the parent and a worker process.

A message is one pickle (`_encoding.dumps`) and the buffers it took out of
band, which are copied into the sender's shared-memory arena (see `Sender`)
instead of going through the pipe:
the pipe then carries one frame made of a small header (`b"S"`, the arena's
name and the buffer sizes) and the pickle. The receiver copies the buffers out
of the arena and hands them to `pickle.loads`.

Every message is exactly one frame on the pipe, so a receiver that fails on a
message (cannot map the arena, runs out of memory copying, cannot unpickle)
has still consumed all of it: the next frame is the next message, and a reply
can never reach the call after its own. Only a failure while reading the frame
itself loses the stream's position (`StreamBroken`): that worker must go.

If `/dev/shm` has no room for a message's buffers (`posix_fallocate` says
ENOSPC; Docker's default is 64 MiB), they travel inside the frame instead
(`b"P"`): slower, but a touch of an unbacked page would kill the process
with SIGBUS.

Why an arena reused for every message, and a copy out of it, rather than a
fresh file per message that the receiver keeps as zero-copy views: on the
development machine, allocating, faulting in and freeing fresh shared pages
cost about 1 µs per 4 KiB page at each step, three times the cost of copying
into warm pages (32 MiB round trip: about 90 ms with fresh files, about 30 ms
with arenas).

Shared memory is used where `/dev/shm` exists (Linux); elsewhere everything
goes through the pipe.
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import pickle
import struct
import sys
from multiprocessing.connection import Connection
from typing import Any, final

SHM_DIR = "/dev/shm"
SHM_AVAILABLE = os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)

#: 256 KiB: the first design suggested starting at 1 MiB; measured round trips
#: (`benchmarks/results/latest/process/process.md`) put the arena ahead of the
#: pipe from 256 KiB and level with it at 64 KiB, where it is not worth the
#: memory. Why: docs/decisions/0012-shared-memory-from-256-kib.md
DEFAULT_SHM_THRESHOLD = 256 << 10

_HEADER = b"S"
#: Buffers inline, after the header: shared memory had no room for them.
_INLINE = b"P"
#: An arena above this size shrinks when a message needs under a quarter of it.
_SHRINK_ABOVE = 64 << 20
_names = itertools.count()


class StreamBroken(Exception):
    """Reading a frame failed part-way (out of memory, say): the pipe's position
    is lost, so the connection must not be read again."""


class ArenaError(Exception):
    """The shared-memory arena for a message could not be made (too many open
    files, no memory to map it): the message was not sent; the pipe is intact."""


def shm_prefix(pid: int) -> str:
    """The file-name prefix of every shared-memory file process `pid` creates."""
    return f"offload-{pid}-"


def unlink(name: str) -> None:
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except OSError:
        pass


def _arena_size(needed: int) -> int:
    # Powers of two: a payload that grows a little does not remap every time.
    return 1 << max(needed - 1, 1).bit_length()


@final
class Sender:
    """The sending end of one direction of one worker's pipe, with its
    shared-memory arena: one file, mapped once and reused for every message,
    so the pages are allocated and faulted in once, not per message.

    Reuse is safe because the protocol is strictly request/reply: a sender
    writes message k+1 only after the receiver has answered message k, and
    the receiver copies the buffers out before it answers.
    """

    def __init__(self) -> None:
        self.name: str | None = None
        self._region: mmap.mmap | None = None

    def send(self, conn: Connection, data: bytes, buffers: list[pickle.PickleBuffer]) -> None:
        """Send one message as one frame. Raises `ArenaError` (nothing sent) if
        the arena cannot be made, `OSError` if the pipe is broken."""
        conn.send_bytes(self._frame(data, buffers))

    def _frame(self, data: bytes, buffers: list[pickle.PickleBuffer]) -> bytes:
        if not buffers:
            return data
        raws = [b.raw() for b in buffers]
        sizes = [r.nbytes for r in raws]
        try:
            region = self._arena(sum(sizes))
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise ArenaError(
                    f"could not make a shared-memory arena of {sum(sizes)} bytes: {exc}"
                ) from exc
            sizes_packed = struct.pack(f"<HI{len(sizes)}Q", 0, len(sizes), *sizes)
            return b"".join((_INLINE, sizes_packed, *raws, data))
        offset = 0
        for raw, size in zip(raws, sizes, strict=True):
            region[offset : offset + size] = raw
            offset += size
        assert self.name is not None
        encoded = self.name.encode()
        header = struct.pack(f"<HI{len(sizes)}Q", len(encoded), len(sizes), *sizes)
        return b"".join((_HEADER, header, encoded, data))

    def _arena(self, needed: int) -> mmap.mmap:
        region = self._region
        # Grow to fit; give back a big arena that is mostly idle.
        if region is not None and needed <= len(region) and not (
            len(region) > _SHRINK_ABOVE and needed * 4 < len(region)
        ):
            return region
        self.close()
        size = _arena_size(needed)
        name = f"{shm_prefix(os.getpid())}{next(_names)}"
        fd = os.open(os.path.join(SHM_DIR, name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            _reserve(fd, size)
            region = mmap.mmap(fd, size)
        except BaseException:
            unlink(name)
            raise
        finally:
            os.close(fd)
        self.name, self._region = name, region
        return region

    def close(self) -> None:
        """Drop the arena (and its file, if the receiver has not unlinked it yet)."""
        if self.name is not None:
            unlink(self.name)
        if self._region is not None:
            self._region.close()
        self.name = self._region = None


def _reserve(fd: int, size: int) -> None:
    """Size the file and make tmpfs reserve its pages now: `ftruncate` alone
    reserves nothing, and a copy into an unbacked page is a SIGBUS that kills
    the process. Raises `OSError` (ENOSPC) when `/dev/shm` is too full."""
    os.ftruncate(fd, size)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        # A filesystem that cannot reserve (not tmpfs) keeps ftruncate's behaviour.
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise


@final
class Receiver:
    """The receiving end: maps the sender's arena once (and unlinks its file,
    so nothing is left in `/dev/shm` whoever dies first) and copies each
    message's buffers out, so results never alias the reused arena."""

    def __init__(self) -> None:
        self._name: str | None = None
        self._region: mmap.mmap | None = None

    def recv(self, conn: Connection) -> Any:
        """Receive and unpickle a message (`read`, then `decode`)."""
        return self.decode(self.read(conn))

    def read(self, conn: Connection) -> bytes:
        """Read one whole frame. Raises `EOFError`/`OSError` if the peer is
        gone, `StreamBroken` if the frame could not be read whole."""
        try:
            return conn.recv_bytes()
        except (EOFError, OSError):
            raise
        except Exception as exc:
            raise StreamBroken(f"reading a message failed part-way: {exc!r}") from exc

    def decode(self, message: bytes) -> Any:
        """Unpickle a frame that `read` returned; an empty one is `None` (the
        "stop" signal). An exception here concerns this message only: the
        stream is still in step."""
        if not message:
            return None
        kind = message[:1]
        if kind not in (_HEADER, _INLINE):
            return pickle.loads(message)
        name_length, count = struct.unpack_from("<HI", message, 1)
        sizes = struct.unpack_from(f"<{count}Q", message, 7)
        start = 7 + 8 * count
        buffers: list[Any] = []
        with memoryview(message) as frame:
            if kind == _INLINE:
                end = _copy_out(frame, start, sizes, buffers)
                return pickle.loads(frame[end:], buffers=buffers)
            name = bytes(frame[start : start + name_length]).decode()
            with memoryview(self._map(name)) as view:
                _copy_out(view, 0, sizes, buffers)
            return pickle.loads(frame[start + name_length :], buffers=buffers)

    def _map(self, name: str) -> mmap.mmap:
        if name == self._name and self._region is not None:
            return self._region
        self.close()
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_RDWR)
        try:
            region = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        # Only once mapped: a map that failed (no memory, no file descriptor)
        # leaves the file for the next message, which the sender writes into
        # the same arena; unlinked first, every later one would fail.
        os.unlink(path)
        self._name, self._region = name, region
        return region

    def close(self) -> None:
        if self._region is not None:
            try:
                self._region.close()
            except BufferError:
                pass  # still viewed (a traceback's frame): unmapped when freed
        self._name = self._region = None


def _copy_out(view: memoryview, offset: int, sizes: tuple[int, ...], buffers: list[Any]) -> int:
    """Append a copy of each buffer to `buffers`; return the offset past them."""
    for size in sizes:
        part = view[offset : offset + size]
        try:
            buffers.append(_copy(part))
        finally:
            # A failed copy's traceback keeps `part` alive; released, it no
            # longer pins the arena (which could then never be unmapped).
            part.release()
        offset += size
    return offset


def _copy(view: memoryview) -> Any:
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return bytearray(view)
    # NumPy asks for transparent huge pages for big allocations: far fewer
    # page faults than a bytearray of the same size.
    out = numpy.empty(view.nbytes, dtype=numpy.uint8)
    out[:] = numpy.frombuffer(view, dtype=numpy.uint8)
    return out


def remove_shm_files(prefix: str) -> None:
    """Remove leftover shared-memory files of a process that died mid-transfer."""
    if not SHM_AVAILABLE:
        return
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
            except OSError:
                pass
