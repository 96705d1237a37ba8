"""The code that runs inside a Ray actor.

Kept apart from `_executor.py` so that an actor imports only what it needs.
Each call answers `("ok", result)` or `("error", (exception or None, traceback
text))`; the exception travels as a value, not as Ray's `RayTaskError`
wrapper, so the caller gets the function's own exception type back.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from typing import Any

import ray
from ray import cloudpickle
from tblib import pickling_support

from offload.strategy import Call


def _strip_tracebacks(exc: BaseException) -> None:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        current.__traceback__ = None
        current = current.__cause__ or current.__context__


def portable_error(exc: BaseException) -> tuple[BaseException | None, str]:
    """`exc` if it survives pickling (with its traceback where possible), else
    `None`; always the formatted traceback text."""
    text = "".join(traceback.format_exception(exc))
    # Per instance: the class may have been defined after the actor started.
    pickling_support.install(exc)
    for attempt in range(2):
        try:
            cloudpickle.loads(cloudpickle.dumps(exc))
        except Exception:  # noqa: PERF203 (two tries at most, on an error path)
            if attempt:
                return None, text
            # A deep traceback fails to pickle (one pickle frame per stack
            # frame): keep the type and message, drop the frames.
            _strip_tracebacks(exc)
        else:
            break
    return exc, text


class RayWorker:
    """One actor: runs `initializer(*initargs)` once, then calls, one at a time."""

    def __init__(self, initializer: Callable[..., Any] | None, initargs: tuple[Any, ...]) -> None:
        self._has_state = initializer is not None
        self._state: Any = None
        self._init_error: tuple[BaseException | None, str] | None = None
        if initializer is not None:
            try:
                self._state = initializer(*initargs)
            except BaseException as exc:
                self._init_error = portable_error(exc)

    def ready(self) -> tuple[BaseException | None, str] | None:
        """`None` once the initializer ran, else its error (see `portable_error`)."""
        return self._init_error

    def where(self) -> tuple[str, int]:
        """(node id, pid) of this actor."""
        return ray.get_runtime_context().get_node_id(), os.getpid()

    def run(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> tuple[str, Any]:
        call: Call[Any] = Call(fn, args, kwargs)
        if self._has_state:
            call.execute(self._state)
        else:
            call.execute()
        del fn, args, kwargs
        try:
            return "ok", call.outcome()
        except BaseException as exc:
            return "error", portable_error(exc)
