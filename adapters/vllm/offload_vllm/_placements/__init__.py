"""Placements: one class per kind of placement (`_kinds.py`), chosen once per executor.

A new strategy of an existing kind is a row of `_kinds.STRATEGY_ROWS` (a
built-in's derived from the core's table, a plugin's in `_kinds.PLUGIN_ROWS`)
and nothing here; a new kind is a `PlacementKind` there and a `Placement`
subclass here, listed in `_BY_KIND`.
"""

from __future__ import annotations

from .._kinds import STRATEGY_ROWS
from .base import Call as Call
from .base import Placement as Placement
from .batched import Batched as Batched
from .in_thread import InThread as InThread
from .on_loop import OnLoop as OnLoop
from .remote import Remote as Remote

_BY_KIND = {cls.kind: cls for cls in (OnLoop, InThread, Remote, Batched)}


def placement_class(strategy: str) -> type[Placement]:
    """The placement of `strategy` (a key of `_kinds.STRATEGY_ROWS`)."""
    return _BY_KIND[STRATEGY_ROWS[strategy].kind]
