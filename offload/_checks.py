"""Argument checks: one function per kind of value, each with one message
(a `ConfigError` naming the option). Public for strategy authors in
`offload.strategy` (`check_positive_int`, `check_non_negative_number`,
`check_positive_number`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ._errors import ConfigError


def _refuse(name: str, kind: str, value: object, or_none: bool) -> ConfigError:
    return ConfigError(f"{name} must be {'None (unbounded) or ' if or_none else ''}{kind}, got {value!r}")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_positive_int(value: object, name: str, *, or_none: bool = False) -> int:
    """`value`, an `int` of 1 or more (not a `bool`): a count (workers,
    calls, bytes). `or_none` mentions in the message that `None` is allowed
    too (the caller lets `None` through before calling)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _refuse(name, "a positive integer (1 or more)", value, or_none)
    return value


def check_non_negative_int(value: object, name: str, *, or_none: bool = False) -> int:
    """`value`, an `int` of 0 or more (not a `bool`)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _refuse(name, "an integer >= 0", value, or_none)
    return value


def check_non_negative_number(value: object, name: str, *, or_none: bool = False) -> float:
    """`value` as a `float`: a finite number of 0 or more (not a `bool`): a
    cost, a share, a wait that may be none."""
    if not _is_number(value) or not 0 <= value < math.inf:  # type: ignore[operator]
        raise _refuse(name, "a finite number >= 0", value, or_none)
    return float(value)  # type: ignore[arg-type]


def check_positive_number(value: object, name: str, *, or_none: bool = False) -> float:
    """`value` as a `float`: a finite number above 0 (not a `bool`): an
    interval, a timeout, a bound."""
    if not _is_number(value) or not 0 < value < math.inf:  # type: ignore[operator]
        raise _refuse(name, "a finite number > 0", value, or_none)
    return float(value)  # type: ignore[arg-type]


def check_timeout(timeout: object, *, allow_zero: bool) -> None:
    """Validate a timeout: `None`, or a number of seconds > 0 (>= 0 with `allow_zero`)."""
    if timeout is None:
        return
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or math.isnan(timeout)
        or not (timeout >= 0 if allow_zero else timeout > 0)
    ):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"timeout must be a number of seconds {bound} or None, got {timeout!r}")


# ---- the options' own names --------------------------------------------------------


def check_max_workers(value: object, *, source: str = "max_workers") -> int:
    """Validate a worker count: a positive `int` (not a `bool`)."""
    return check_positive_int(value, source)


def check_cost(cost: object, *, source: str = "cost") -> float:
    """Validate a call's cost: a finite number >= 0 (not a `bool`)."""
    return check_non_negative_number(cost, source)


def check_max_queue(value: object) -> int | None:
    """Validate `max_queue`: `None` (unbounded) or an `int` >= 0."""
    return None if value is None else check_non_negative_int(value, "max_queue", or_none=True)


def check_max_queued_cost(value: object) -> float | None:
    """Validate `max_queued_cost`: `None` (unbounded) or a finite number > 0."""
    return None if value is None else check_positive_number(value, "max_queued_cost", or_none=True)


def check_initializer(initializer: Callable[..., Any] | None, initargs: tuple[Any, ...]) -> None:
    """Validate a strategy's `initializer` (callable or `None`) and `initargs` (a tuple)."""
    if initializer is not None and not callable(initializer):
        raise ConfigError(f"initializer must be callable or None, got {initializer!r}")
    if not isinstance(initargs, tuple):
        raise ConfigError(f"initargs must be a tuple, got {type(initargs).__name__}")
