"""How each setting's text becomes its value: one parser per shape of value.

A parser is `parse(variable, text) -> value`, and refuses a bad text with
`OffloadVLLMConfigError` naming the variable and the text. Where offload's
core checks the same thing (a worker count, a lane's name and weight), the
core's own check decides (`offload.strategy.check_max_workers`,
`offload.strategy.Lanes`), so that what starts here starts the executor.
Numbers are read as offload reads `OFFLOAD_MAX_WORKERS`: ASCII only, no `_`
(`int()` and `float()` would take `+4`, `1_0` or `٤`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import offload
import offload.strategy

from ._lanes import LANE_HEADER, LANE_NAME_CHARACTERS, is_lane_name
from ._routes import ADMITTED_PATHS

#: `parse(variable, text)`: the value, or `OffloadVLLMConfigError` naming both.
Parser = Callable[[str, str], Any]

SCHEDULING = ("fair", "fifo")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

#: `OFFLOAD_VLLM_LANE_HEADER`'s words: every lane may be named, or none.
LANE_HEADER_ON = "on"
LANE_HEADER_OFF = "off"


class OffloadVLLMConfigError(offload.ConfigError):
    """An `OFFLOAD_VLLM_*`/`OFFLOAD_*` setting is invalid; raised at plugin load."""


def _digits(raw: str) -> int | None:
    """`raw` as a count: plain ASCII digits only, else `None`."""
    return int(raw) if raw.isascii() and raw.isdigit() else None


def _number(raw: str) -> float:
    """`raw` as a float (ASCII, no `_`); NaN, outside every range, when it is not one."""
    if not raw.isascii() or "_" in raw:
        return math.nan
    try:
        return float(raw)
    except ValueError:
        return math.nan


def workers(name: str, raw: str) -> int:
    """A worker count, checked by offload's own check."""
    count = _digits(raw)
    if count is None:
        raise OffloadVLLMConfigError(f"{name}={raw!r} is not an integer; give a worker count >= 1 (digits only)")
    try:
        return offload.strategy.check_max_workers(count, source=name)
    except offload.ConfigError as exc:
        raise OffloadVLLMConfigError(str(exc)) from None


def integer(low: int, high: int | None, noun: str, give: str) -> Parser:
    """An integer from `low` to `high` (no bound: `None`), else "`raw` is not `noun`; give `give`"."""

    def parse(name: str, raw: str) -> int:
        value = _digits(raw)
        if value is None or value < low or (high is not None and value > high):
            raise OffloadVLLMConfigError(f"{name}={raw!r} is not {noun}; give {give}")
        return value

    return parse


def _checked(check: Callable[[object, str], float], name: str, value: float, refusal: str) -> float:
    """`value` as the core's `check` takes it, else `OffloadVLLMConfigError(refusal)`:
    the core decides the range, the adapter words the answer."""
    try:
        return check(value, name)
    except offload.ConfigError:
        raise OffloadVLLMConfigError(refusal) from None


def positive(what: str) -> Parser:
    """A finite number > 0 (`offload.strategy.check_positive_number`)."""

    def parse(name: str, raw: str) -> float:
        value = _number(raw)
        if math.isnan(value):
            raise OffloadVLLMConfigError(f"{name}={raw!r} is not a number; give {what} (> 0)")
        refusal = f"{name}={raw!r}: {what} must be a finite number > 0"
        return _checked(offload.strategy.check_positive_number, name, value, refusal)

    return parse


def cost_bound(zero_means: str) -> Parser:
    """A bound in the cost unit: a finite number >= 0 (`offload.strategy.check_non_negative_number`)."""

    def parse(name: str, raw: str) -> float:
        refusal = f"{name}={raw!r} is not a cost; give a number of characters >= 0 (0: {zero_means})"
        return _checked(offload.strategy.check_non_negative_number, name, _number(raw), refusal)

    return parse


def batch_wait(name: str, raw: str) -> float:
    seconds = _number(raw)
    if not 0 <= seconds <= 1:
        raise OffloadVLLMConfigError(f"{name}={raw!r} is not a wait; give seconds from 0 to 1, such as 0.002")
    return seconds


def switch(name: str, raw: str) -> bool:
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise OffloadVLLMConfigError(f"{name}={raw!r} is not a switch; give 1 or 0 (true/false, yes/no, on/off)")


def scheduling(name: str, raw: str) -> str:
    if raw not in SCHEDULING:
        raise OffloadVLLMConfigError(f"{name}={raw!r} is not a scheduling; valid: {', '.join(SCHEDULING)}")
    return raw


def text(name: str, raw: str) -> str:
    return raw


def _pairs(name: str, raw: str, shape: str) -> list[tuple[str, str]]:
    """`a=b,c=d` as `[(a, b), (c, d)]`, each part stripped; refused unless every
    item has both parts and no left-hand side repeats."""
    pairs: list[tuple[str, str]] = []
    for item in raw.split(","):
        left, sep, right = item.partition("=")
        left, right = left.strip(), right.strip()
        if not sep or not left or not right:
            raise OffloadVLLMConfigError(f"{name}={raw!r}: {item.strip()!r} is not {shape}; give {shape},...")
        if left in dict(pairs):
            raise OffloadVLLMConfigError(f"{name}={raw!r}: {left} is given twice")
        pairs.append((left, right))
    return pairs


def _check_lane_name(name: str, raw: str, lane: str) -> None:
    if not is_lane_name(lane):
        raise OffloadVLLMConfigError(
            f"{name}={raw!r}: {lane!r} is not a lane name; a lane name is made of {LANE_NAME_CHARACTERS} "
            f"(an HTTP token, so that the {LANE_HEADER} header can name it)"
        )


def lanes(name: str, raw: str) -> tuple[tuple[str, float], ...]:
    """`LANE=WEIGHT,...`; names and weights checked by the executor's own check."""
    found = []
    for lane, weight in _pairs(name, raw, "LANE=WEIGHT"):
        _check_lane_name(name, raw, lane)
        found.append((lane, positive(f"the weight of lane {lane!r}")(name, weight)))
    try:
        offload.strategy.Lanes(dict(found), setting=f"{name}={raw!r}")
    except offload.ConfigError as exc:
        raise OffloadVLLMConfigError(str(exc)) from None
    return tuple(found)


def lane_header(name: str, raw: str) -> tuple[str, ...] | None:
    """`None` (`on`: every lane), `()` (`off`: the header is ignored), or the lanes a header may name."""
    if raw == LANE_HEADER_ON:
        return None
    if raw == LANE_HEADER_OFF:
        return ()
    named: list[str] = []
    for item in raw.split(","):
        lane = item.strip()
        if not lane:
            raise OffloadVLLMConfigError(
                f"{name}={raw!r}: give {LANE_HEADER_ON}, {LANE_HEADER_OFF} or a list of lanes LANE,..."
            )
        _check_lane_name(name, raw, lane)
        if lane in named:
            raise OffloadVLLMConfigError(f"{name}={raw!r}: {lane} is given twice")
        named.append(lane)
    return tuple(named)


def lane_routes(name: str, raw: str) -> tuple[tuple[str, str], ...]:
    routes = _pairs(name, raw, "ROUTE=LANE")
    for route, _ in routes:
        if route not in ADMITTED_PATHS:
            raise OffloadVLLMConfigError(
                f"{name}={raw!r}: {route} is not a pooling or generate route; valid: {', '.join(sorted(ADMITTED_PATHS))}"
            )
    return tuple(routes)
