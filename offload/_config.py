"""Configuration: explicit arguments first, then the environment, then defaults."""

from __future__ import annotations

import os
from collections.abc import Mapping

from ._checks import check_max_workers
from ._errors import ConfigError

STRATEGY_ENV = "OFFLOAD_STRATEGY"
MAX_WORKERS_ENV = "OFFLOAD_MAX_WORKERS"

#: The strategy used when neither an argument nor `OFFLOAD_STRATEGY` names one:
#: a thread pool is what `run_in_executor(None, ...)` and vLLM's `make_async` use,
#: so it is the least surprising default.
DEFAULT_STRATEGY = "thread"


def default_thread_workers() -> int:
    """`min(32, cpus + 4)`, the standard library's `ThreadPoolExecutor` default, so that
    swapping `loop.run_in_executor(None, ...)` for `thread` keeps the same pool size."""
    return min(32, usable_cpu_count() + 4)


def usable_cpu_count() -> int:
    """CPUs this process may run on (affinity-aware), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover (not Linux)
        return os.cpu_count() or 1


def strategy_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    value = (os.environ if environ is None else environ).get(STRATEGY_ENV, "").strip()
    return value or None


def max_workers_from_env(environ: Mapping[str, str] | None = None) -> int | None:
    raw = (os.environ if environ is None else environ).get(MAX_WORKERS_ENV, "").strip()
    if not raw:
        return None
    # Plain ASCII digits only: `int()` would also take "1_0", "+4" or "٤".
    if not (raw.isascii() and raw.isdigit()):
        raise ConfigError(
            f"{MAX_WORKERS_ENV}={raw!r} is not an integer; set it to a positive integer "
            "(digits only) or leave it unset for the strategy's default"
        )
    return check_max_workers(int(raw), source=MAX_WORKERS_ENV)
