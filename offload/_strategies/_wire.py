"""How calls and results cross the pipe between the parent and a worker process.

A message is one protocol-5 pickle. Buffers of at least `threshold` bytes
(NumPy arrays, `bytearray`, torch CPU tensors, and `bytes` passed directly as an
argument or returned directly) are taken out of band and written to one
shared-memory file instead of being copied through the pipe: the pipe then
carries a small header (`b"S"`, the file name and the buffer sizes) followed by
the pickle. The receiver maps the file, unlinks it at once (so nothing is left
in `/dev/shm` once the last view is gone) and hands the mapped buffers to
`pickle.loads`, so NumPy arrays and tensors arrive as views of the shared
memory without a further copy.

Shared memory is used where `/dev/shm` exists (Linux); elsewhere everything
goes through the pipe.
"""

from __future__ import annotations

import copyreg
import io
import itertools
import mmap
import os
import pickle
import struct
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, final

SHM_DIR = "/dev/shm"
SHM_AVAILABLE = os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)

#: 1 MiB: below it, pickling through the pipe is as fast as the extra file
#: create/map/unlink (see `benchmarks/results/process.md`, payload transfer).
DEFAULT_SHM_THRESHOLD = 1 << 20

_HEADER = b"S"
_names = itertools.count()


@final
class LargeBytes:
    """Wraps a top-level `bytes` argument or result so that it can leave the
    pickle out of band (the pickler never lets `bytes` do so by itself)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return bytes, (pickle.PickleBuffer(self.data),)


def wrap_bytes(value: Any, threshold: int | None) -> Any:
    if threshold is not None and type(value) is bytes and len(value) >= threshold:
        return LargeBytes(value)
    return value


def _rebuild_tensor(array: Any) -> Any:
    import torch

    return torch.from_numpy(array)


def _reduce_tensor(tensor: Any) -> tuple[Any, ...]:
    # Only plain CPU tensors go through NumPy (and so out of band); anything
    # else (grad, sparse, other devices, dtypes NumPy lacks) keeps torch's own pickling.
    try:
        import torch

        if tensor.device.type == "cpu" and tensor.layout == torch.strided and not tensor.requires_grad:
            return _rebuild_tensor, (tensor.detach().contiguous().numpy(),)
    except (TypeError, RuntimeError):
        pass
    return tensor.__reduce_ex__(pickle.HIGHEST_PROTOCOL)  # type: ignore[no-any-return]


def _dispatch_table() -> dict[type, Callable[[Any], Any]]:
    # torch is never imported here: if the caller has it loaded, tensors exist.
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    return {torch.Tensor: _reduce_tensor}


def dumps(obj: Any, threshold: int | None) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """Pickle `obj`; return the pickle and the buffers that must travel out of band."""
    buffers: list[pickle.PickleBuffer] = []
    if not SHM_AVAILABLE:
        threshold = None

    def keep_large(buffer: pickle.PickleBuffer) -> bool:
        # False means "out of band".
        if threshold is not None and buffer.raw().nbytes >= threshold:
            buffers.append(buffer)
            return False
        return True

    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=5, buffer_callback=keep_large)
    table = _dispatch_table()
    if table:
        # A per-pickler table replaces copyreg's, so keep copyreg's entries (tblib's).
        pickler.dispatch_table = {**copyreg.dispatch_table, **table}
    pickler.dump(obj)
    return out.getvalue(), buffers


def shm_prefix(pid: int) -> str:
    """The file-name prefix of every shared-memory file process `pid` creates."""
    return f"offload-{pid}-"


def send(conn: Connection, data: bytes, buffers: list[pickle.PickleBuffer]) -> str | None:
    """Send a pickle and its out-of-band buffers; return the shared-memory file
    name the receiver will unlink (the sender removes it if the receiver dies first)."""
    if not buffers:
        conn.send_bytes(data)
        return None
    raws = [b.raw() for b in buffers]
    sizes = [r.nbytes for r in raws]
    name = f"{shm_prefix(os.getpid())}{next(_names)}"
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        total = sum(sizes)
        os.ftruncate(fd, total)
        with mmap.mmap(fd, total) as region:
            offset = 0
            for raw, size in zip(raws, sizes, strict=True):
                region[offset : offset + size] = raw
                offset += size
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    encoded = name.encode()
    try:
        conn.send_bytes(
            _HEADER + struct.pack(f"<HI{len(sizes)}Q", len(encoded), len(sizes), *sizes) + encoded
        )
        conn.send_bytes(data)
    except BaseException:
        unlink(name)
        raise
    return name


def unlink(name: str) -> None:
    """Remove a shared-memory file this process sent, if the receiver has not."""
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except OSError:
        pass


def recv(conn: Connection) -> Any:
    """Receive what `send` sent and unpickle it. An empty message is returned as `None`
    (the "stop" signal); single-letter control messages are returned as bytes."""
    message = conn.recv_bytes()
    if len(message) <= 1:
        return message or None
    if message[:1] != _HEADER:
        return pickle.loads(message)
    name_length, count = struct.unpack_from("<HI", message, 1)
    sizes = struct.unpack_from(f"<{count}Q", message, 7)
    name = message[7 + 8 * count : 7 + 8 * count + name_length].decode()
    buffers = _map(name, sizes)
    return pickle.loads(conn.recv_bytes(), buffers=buffers)


def _map(name: str, sizes: tuple[int, ...]) -> list[memoryview]:
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR)
    try:
        os.unlink(path)
        region = mmap.mmap(fd, sum(sizes))
    finally:
        os.close(fd)
    # The mapping lives as long as any view of it (an array built on it): no copy.
    view = memoryview(region)
    buffers = []
    offset = 0
    for size in sizes:
        buffers.append(view[offset : offset + size])
        offset += size
    return buffers


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
