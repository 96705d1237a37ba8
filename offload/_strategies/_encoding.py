"""How a call, its arguments and its result become bytes for a worker process.

One protocol-5 pickle per message. Buffers of at least a threshold's bytes
(NumPy arrays, CPU torch tensors, and `bytes` or `bytearray` passed directly as
an argument or returned directly) are taken out of band: `dumps` returns them
beside the pickle, for the transport (`_wire`) to carry through shared memory.
Functions travel by reference, including one whose name a decorator took.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import sys
from collections.abc import Callable
from typing import Any, final

from . import _wire


@final
class LargeBytes:
    """Wraps a top-level `bytes` or `bytearray` argument or result so that it can
    leave the pickle out of band (the pickler never lets them do so by itself)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes | bytearray) -> None:
        self.data = data

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return type(self.data), (pickle.PickleBuffer(self.data),)


def wrap_bytes(value: Any, threshold: int | None) -> Any:
    if threshold is not None and type(value) in (bytes, bytearray) and len(value) >= threshold:
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
    if not _wire.SHM_AVAILABLE:
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


