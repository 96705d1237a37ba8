"""Which lane a pooling request joins: by a request header, else by its route.

Lanes are the executor's (`OFFLOAD_VLLM_LANES`, plus `"default"`, which
always exists): backlogged lanes share the workers in proportion to their
weights. A request may name its lane in the `X-Offload-Lane` header, as far
as `OFFLOAD_VLLM_LANE_HEADER` lets it (`HeaderLanes`: every lane, none, or a
list); without the header, or with the header ignored, `OFFLOAD_VLLM_LANE_ROUTES`
maps its route (the path without the server's `--root-path`) to a lane;
anything else goes to `"default"`.

A lane name is an HTTP token (RFC 9110: ASCII letters, digits and
``!#$%&'*+-.^_`|~``), so that a header can carry it as it is: a server reads
header bytes as latin-1, and a name outside ASCII could never be named by a
client.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import offload.strategy

#: The lane every offload executor has, whatever its `lanes=` (`offload.Executor`):
#: the core's name for it, not a second copy.
DEFAULT_LANE = offload.strategy.Lanes().default.name

#: The request header that names a request's lane (HTTP header names are
#: case-insensitive; ASGI gives them lower-cased).
LANE_HEADER = "X-Offload-Lane"

#: What a lane name may hold: an HTTP token (RFC 9110, section 5.6.2).
LANE_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")

#: The characters of `LANE_NAME`, in words (start-up errors, docs).
LANE_NAME_CHARACTERS = "ASCII letters, digits and !#$%&'*+-.^_`|~"


def is_lane_name(name: str) -> bool:
    """Whether `name` may name a lane (`LANE_NAME`)."""
    return LANE_NAME.fullmatch(name) is not None


class UnknownLane(ValueError):
    """A request names a lane the server does not take from its header (HTTP 400)."""


class RepeatedLaneHeader(UnknownLane):
    """A request carries `LANE_HEADER` more than once (HTTP 400)."""


@dataclass(frozen=True)
class LaneRouter:
    """Picks a request's lane from its header or its route."""

    #: Every lane the executor has, `"default"` included.
    lanes: frozenset[str]
    #: Route (a path without the root path) -> lane.
    routes: Mapping[str, str]
    #: The lanes a request may name in `LANE_HEADER` (`OFFLOAD_VLLM_LANE_HEADER`);
    #: `None`: every lane; empty: the header is ignored.
    header_lanes: frozenset[str] | None = None

    @classmethod
    def of(
        cls, lanes: Iterable[str], routes: Mapping[str, str], header_lanes: Iterable[str] | None = None
    ) -> LaneRouter:
        return cls(frozenset(lanes), dict(routes), None if header_lanes is None else frozenset(header_lanes))

    def lane_for(self, route: str | None, header: str | None) -> str | None:
        """The lane of a request to `route` with `header` (the value of
        `LANE_HEADER`, or `None`); `None` is the default lane. Raises
        `UnknownLane` for a header naming a lane the header may not name;
        a header the server ignores (no lane may be named) is no header."""
        allowed = self.lanes if self.header_lanes is None else self.header_lanes
        if header is not None and allowed:
            lane = header.strip()
            if lane not in allowed:
                # The lanes are not listed: they are the operator's to tell
                # clients, and vLLM authenticates no route outside /v1, /v2.
                raise UnknownLane(f"{LANE_HEADER}: {header[:64]!r} is not a lane this server takes from the header")
            return lane
        return None if route is None else self.routes.get(route)

    def lane_from(self, route: str | None, headers: Sequence[str]) -> str | None:
        """`lane_for` a request to `route` that carries `headers`, the values of
        its `LANE_HEADER` lines. The header names one lane (RFC 9110 allows a
        field that is not a list once): where the header may name lanes, a
        request that carries it twice is refused, `RepeatedLaneHeader`, rather
        than served in whichever lane the first names (a proxy that adds its own
        line after the client's would leave the client's in force); two values
        in one line (`a, b`) name no lane, `UnknownLane`."""
        allowed = self.lanes if self.header_lanes is None else self.header_lanes
        if len(headers) > 1 and allowed:
            raise RepeatedLaneHeader(
                f"{LANE_HEADER} is sent {len(headers)} times; a request names its lane in one {LANE_HEADER} header"
            )
        return self.lane_for(route, headers[0] if headers else None)
