"""On the loop (`inline`): vLLM's own IO processors and serving objects, called where they are."""

from __future__ import annotations

from typing import Any

from .._kinds import ON_LOOP
from .base import Call, Placement


class OnLoop(Placement):
    """Calls run on the event loop, with the objects vLLM built: the reference
    every other placement must agree with."""

    kind = ON_LOOP

    def render_call(self, io_processor: Any) -> Call:
        return io_processor.render, ()
