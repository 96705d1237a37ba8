"""`inline`: run the call right here, on the caller's thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, final

from .._call import Call
from .._checks import check_initializer
from .._errors import executor_closed, initializer_failed
from .._initializer_state import _NO_STATE
from .._strategy import Strategy


@final
class InlineStrategy(Strategy):
    """Runs each call synchronously on the calling thread: under `run`, on the
    event loop itself, which it blocks for the call's duration.

    This is the baseline every other strategy is measured and tested against
    (vLLM's "main (sync)"), and the right choice when calls are so short that
    any hand-off costs more than it saves.
    """

    name = "inline"

    def __init__(
        self, *, initializer: Callable[..., Any] | None = None, initargs: tuple[Any, ...] = ()
    ) -> None:
        """The calling thread is the worker: with `initializer=`, it runs once per
        calling thread, before that thread's first call. Cancellation cannot
        happen mid-call (the loop is blocked), and there is no queue, so a call
        always starts at once.

        Args:
            initializer: run once per calling thread; its return value is `worker_state()`.
                If it raises, the call fails with `OffloadError` (the cause
                attached) and the next call on that thread tries it again.
            initargs: positional arguments for `initializer`.
        """
        check_initializer(initializer, initargs)
        self._initializer = initializer
        self._initargs = initargs
        self._states = threading.local()
        self._closed = False

    def _state(self) -> Any:
        if self._initializer is None:
            return _NO_STATE
        try:
            return self._states.value
        except AttributeError:
            self._states.value = self._initializer(*self._initargs)
            return self._states.value

    def schedule(self, call: Call[Any]) -> None:
        if self._closed:
            raise executor_closed(self.name)
        if call.claim():
            try:
                state = self._state()
            except BaseException as exc:
                # Wrapped as every other strategy wraps it: the caller can tell a
                # broken worker from a failing call.
                call.set_exception(initializer_failed(self._initializer, exc))
                return
            call.execute(state)

    def shutdown(self, wait: bool, cancel_futures: bool) -> None:
        # Nothing queues here; a call running now finishes on its caller's thread.
        self._closed = True
