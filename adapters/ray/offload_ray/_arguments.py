"""Large arguments cross to an actor through Ray's object store."""

from __future__ import annotations

from typing import Any

import ray

#: Arguments of at least this many bytes (`bytes`, `bytearray`, NumPy arrays,
#: anything with an integer `nbytes`) are put in the object store once and
#: passed by reference. 100 KiB is Ray's own limit for inlining an argument in
#: the task message (`max_direct_call_object_size`), so smaller values would
#: only gain a round trip to the store.
DEFAULT_OBJECT_STORE_THRESHOLD = 100 << 10


def through_object_store(
    args: tuple[Any, ...], kwargs: dict[str, Any], threshold: int | None
) -> tuple[tuple[Any, ...], dict[str, Any], list[Any]]:
    """`args` and `kwargs` with each top-level value of `threshold` bytes or
    more put in the object store and replaced by its reference (Ray resolves
    those before the actor method runs), and the references: the caller keeps
    them alive until the call is over. `threshold=None`: nothing is put."""
    if threshold is None:
        return args, kwargs, []
    stored: list[Any] = []

    def place(value: Any) -> Any:
        size = _nbytes(value)
        if size is None or size < threshold:
            return value
        ref = ray.put(value)
        stored.append(ref)
        return ref

    return tuple(place(a) for a in args), {k: place(v) for k, v in kwargs.items()}, stored


def _nbytes(value: object) -> int | None:
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, memoryview):
        return value.nbytes
    size = getattr(value, "nbytes", None)
    return size if isinstance(size, int) and not isinstance(size, bool) else None
