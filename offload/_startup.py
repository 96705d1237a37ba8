"""What `Executor.start()` waits on: the workers it started, each reporting
once, ready or with the error that stopped it."""

from __future__ import annotations

import threading
from typing import final


@final
class Startup:
    """Counts the workers started for one `start()` call and their outcomes.
    Thread-safe: workers report from their own threads."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._expected = 0
        self._finished = 0
        self._errors: list[BaseException] = []

    def expect(self, workers: int) -> None:
        """`workers` more workers will report (they may already have)."""
        with self._cond:
            self._expected += workers

    def finished(self, error: BaseException | None = None) -> None:
        """A worker is ready (`error=None`) or could not start."""
        with self._cond:
            self._finished += 1
            if error is not None:
                self._errors.append(error)
            self._cond.notify_all()

    def wait(self) -> None:
        """Return once every expected worker reported; raise the first error."""
        with self._cond:
            self._cond.wait_for(lambda: self._finished >= self._expected)
            if self._errors:
                raise self._errors[0]
