"""The code that runs inside a Ray actor.

Kept apart from the strategy so that an actor imports only what it needs.
Each call answers `("ok", result)` or `("error", exception)`: the exception
travels as a value, not wrapped in Ray's `RayTaskError`, so the caller gets
the function's own exception back (`offload.strategy.portable_error`,
checked with cloudpickle, which Ray carries the reply with: it also carries
classes by value, such as an exception class defined in the caller's
`__main__`, which the actor cannot import and pickle would refuse).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import ray
from ray import cloudpickle

from offload.strategy import Call, portable_error


class RayWorker:
    """One actor: `initialize()` runs `initializer(*initargs)` once, then calls
    run one at a time. The constructor does nothing slow, so that the first
    method answered (`where`) says the actor was placed and its process is up,
    apart from how long the initializer takes."""

    def __init__(self, initializer: Callable[..., Any] | None, initargs: tuple[Any, ...]) -> None:
        self._initializer = initializer
        self._initargs = initargs
        self._has_state = initializer is not None
        self._state: Any = None

    def initialize(self) -> BaseException | None:
        """Run the initializer: `None` once it ran, else its error (made portable: see the module)."""
        initializer, self._initializer = self._initializer, None
        if initializer is None:
            return None
        try:
            self._state = initializer(*self._initargs)
        except BaseException as exc:
            return portable_error(exc, dumps=cloudpickle.dumps)
        finally:
            self._initargs = ()
        return None

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
            return "error", portable_error(exc, dumps=cloudpickle.dumps)
