"""`Lane`, `Lanes` and `Flow`: what a call is counted and scheduled in, and a call's cost.

An executor's lanes are one `Lanes`, built (and validated) once from its
`lanes=` option; every call carries one of its `Lane` objects (the executor
stamps its default lane on a call that names none), and the queue and the
admission bounds take those objects as they are. Below both `Call` (whose
`lane` and `flow` they are) and `CallQueue` (which schedules by them): this
module imports neither.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import final

from ._errors import ConfigError

DEFAULT_LANE_NAME = "default"

#: The range of a lane's weight. Weights are ratios between lanes: outside
#: this range `cost / weight` (a lane's virtual time, the vLLM adapter's engine
#: priority) or a lane's share of `max_queued_cost` overflows or underflows
#: for realistic costs (a subnormal weight makes `1 / weight` infinite).
MIN_WEIGHT = 1e-9
MAX_WEIGHT = 1e9


@final
class Lane:
    """A named share of an executor's workers (`Executor(lanes={name: weight})`).

    Backlogged lanes share the workers in proportion to their weights, by
    the cost of the calls served, and an executor's `max_queued_cost` and
    `max_queue` the same way. The weight is a number from `MIN_WEIGHT` (1e-9)
    to `MAX_WEIGHT` (1e9). Immutable; compared by identity.
    """

    __slots__ = ("name", "weight")

    def __init__(self, name: str, weight: float = 1.0) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a lane name must be a non-empty string, got {name!r}")
        if (
            isinstance(weight, bool)
            or not isinstance(weight, (int, float))
            or not MIN_WEIGHT <= weight <= MAX_WEIGHT
        ):
            raise ConfigError(
                f"lane {name!r}: the weight must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}, "
                f"got {weight!r}"
            )
        self.name = name
        self.weight = float(weight)

    def __repr__(self) -> str:
        return f"<Lane {self.name!r} weight={self.weight:g}>"


@final
class Lanes(Mapping[str, Lane]):
    """An executor's lanes by name: `"default"` (weight 1 unless `weights`
    gives it one) and every lane `weights` names, each a `Lane` made once.

    The one place lane names and weights are checked: a bad one raises
    `ConfigError`, whose message starts with `setting` (the option or
    setting they came from, `"lanes"` for `Executor(lanes=)`; an adapter
    names its own). Immutable.
    """

    __slots__ = ("_by_name", "default", "total_weight")

    def __init__(self, weights: Mapping[str, float] | None = None, *, setting: str = "lanes") -> None:
        if weights is not None and not isinstance(weights, Mapping):
            raise ConfigError(f"{setting} must be a mapping of lane name to weight, got {weights!r}")
        try:
            by_name = {
                name: Lane(name, weight) for name, weight in {DEFAULT_LANE_NAME: 1.0, **(weights or {})}.items()
            }
        except ConfigError as exc:
            raise ConfigError(f"{setting}: {exc}") from None
        self._by_name = by_name
        #: The lane of a call (or unit of work) that names none.
        self.default = by_name[DEFAULT_LANE_NAME]
        #: The sum of the weights: a lane's share of a bound is the bound × its weight / this.
        self.total_weight = sum(lane.weight for lane in by_name.values())

    def __getitem__(self, name: str) -> Lane:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def lane(self, name: str | None) -> Lane:
        """The lane called `name` (`None`: the default lane); `ConfigError`,
        listing the lanes, for a name that is not one of them."""
        if name is None:
            return self.default
        found = self._by_name.get(name) if isinstance(name, str) else None
        if found is None:
            raise ConfigError(
                f"unknown lane {name!r}; this executor's lanes are: "
                + ", ".join(repr(known) for known in self._by_name)
            )
        return found

    def weights(self) -> dict[str, float]:
        """`{name: weight}` (a copy)."""
        return {name: lane.weight for name, lane in self._by_name.items()}

    def __repr__(self) -> str:
        return f"<Lanes {self.weights()!r}>"


@final
class Flow:
    """Calls that share one fair share of their lane, served in their order.

    Made by `Executor.admission` for a unit of work (a server request); its
    calls are served one after another while other flows' calls interleave.
    Its scheduling state lives in the queue that holds its calls
    (`CallQueue`), not here. Compared by identity.
    """

    __slots__ = ("lane",)

    def __init__(self, lane: Lane) -> None:
        self.lane = lane

    def __repr__(self) -> str:
        return f"<Flow lane={self.lane.name!r}>"
