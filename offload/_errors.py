"""The exceptions `offload` raises of its own (the offloaded function's own exceptions pass through unchanged)."""

from __future__ import annotations


class OffloadError(Exception):
    """Base class of every error raised by `offload` itself."""


class ConfigError(OffloadError, ValueError):
    """A strategy name, option or environment variable has a bad value.

    Raised when an executor is built or a function is decorated, never at the
    first call, and names the bad value together with the valid ones.
    """


class ExecutorClosed(OffloadError, RuntimeError):
    """The executor was shut down: it accepts no new calls.

    Also raised for calls that were still queued when `shutdown(cancel_futures=True)`
    dropped them.
    """


class WorkerCrashed(OffloadError):
    """The worker running this call died (killed by a signal, segfault, `os._exit`).

    Only this call fails; the strategy replaces the worker and stays usable.
    """


class Overloaded(OffloadError):
    """The executor is full: `max_queue` calls already wait for a worker.

    Raised at once by `run`/`submit`, before anything is done for the call
    (nothing is queued, pickled or run), so a server can answer "busy, retry"
    (HTTP 503 or 429) for the price of a counter check.
    """


def executor_closed(strategy: str) -> ExecutorClosed:
    """The one error for a call refused because its executor's shutdown has begun."""
    return ExecutorClosed(f"the {strategy} executor is shut down: it accepts no new calls")


def initializer_failed(initializer: object, error: BaseException) -> OffloadError:
    """The one error for a worker whose initializer raised (`error` attached as the cause)."""
    failure = OffloadError(f"worker initializer {initializer!r} failed: {error!r}")
    failure.__cause__ = error
    return failure
