"""Which lane a pooling request joins: by a request header, else by its route.

Lanes are the executor's (`OFFLOAD_VLLM_LANES`, plus `"default"`, which
always exists): backlogged lanes share the workers in proportion to their
weights. A request names its lane in the `X-Offload-Lane` header (validated
against the configured lanes: an unknown one is answered 400); without the
header, `OFFLOAD_VLLM_LANE_ROUTES` maps its route (the path without the
server's `--root-path`) to a lane; anything else goes to `"default"`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: The lane every offload executor has, whatever its `lanes=` (`offload.Executor`).
DEFAULT_LANE = "default"

#: The request header that names a request's lane (HTTP header names are
#: case-insensitive; ASGI gives them lower-cased).
LANE_HEADER = "X-Offload-Lane"


class UnknownLane(ValueError):
    """A request names a lane the server does not have (HTTP 400)."""


@dataclass(frozen=True)
class LaneRouter:
    """Picks a request's lane from its header or its route."""

    #: Every lane the executor has, `"default"` included.
    lanes: frozenset[str]
    #: Route (a path without the root path) -> lane.
    routes: Mapping[str, str]

    @classmethod
    def of(cls, lanes: Iterable[str], routes: Mapping[str, str]) -> LaneRouter:
        return cls(frozenset(lanes), dict(routes))

    def lane_for(self, route: str | None, header: str | None) -> str | None:
        """The lane of a request to `route` with `header` (the value of
        `LANE_HEADER`, or `None`); `None` is the default lane. Raises
        `UnknownLane` for a header naming no lane of this server."""
        if header is not None:
            lane = header.strip()
            if lane not in self.lanes:
                raise UnknownLane(
                    f"{LANE_HEADER}: {header!r} is not a lane of this server; its lanes are "
                    + ", ".join(sorted(self.lanes))
                )
            return lane
        return None if route is None else self.routes.get(route)
