"""`Admission`: a unit of work made of several calls (a server request),
admitted once (`Executor.admission`), and the block of code it covers."""

from __future__ import annotations

import contextvars
from typing import final

from ._bounds import Bounds, Hold
from ._lanes import Flow


@final
class Admission:
    """An admitted unit of work (`Executor.admission`): the place it holds,
    its cost, and the flow its calls share."""

    __slots__ = ("_bounds", "_hold", "_owner", "flow", "lane")

    def __init__(self, owner: object, bounds: Bounds | None, hold: Hold | None, flow: Flow) -> None:
        self._owner = owner
        self._bounds = bounds
        self._hold = hold
        #: The flow the block's calls share (one fair share of `lane`).
        self.flow = flow
        #: The lane it was admitted to.
        self.lane = flow.lane.name

    def release_cost(self) -> None:
        """Give back the cost the unit still holds (what its calls have not
        taken over), keeping its place in flight: its priced work is over,
        wherever it ran (work done on the event loop makes no call that
        would take the held cost over). Calls made later in the block are
        counted as they are queued, like any call. Idempotent."""
        hold = self._hold
        if hold is not None and self._bounds is not None:
            self._bounds.unhold(hold, place=False)

    def release(self) -> None:
        """Give the place and the unspent cost back now (idempotent); calls
        made later in the block are still admitted, and still share its flow."""
        hold, self._hold = self._hold, None
        if hold is not None and self._bounds is not None:
            self._bounds.unhold(hold)


# The admission block the current task is in (`Executor.admission`).
_current: contextvars.ContextVar[Admission | None] = contextvars.ContextVar(
    "offload_admitted", default=None
)


def enter(admission: Admission) -> contextvars.Token[Admission | None]:
    """Make `admission` the current task's admission block (undo with `leave`)."""
    return _current.set(admission)


def leave(token: contextvars.Token[Admission | None]) -> None:
    _current.reset(token)


def current_admission(owner: object) -> Admission | None:
    """The admission block of `owner` (an executor) the current task is in;
    `None` outside one."""
    admission = _current.get()
    if admission is None or admission._owner is not owner:
        return None
    return admission


def calls_hold(admission: Admission) -> Hold:
    """What the calls of `admission`'s block are paid from."""
    hold = admission._hold
    if hold is None:
        # Released, or made with no tracker: its calls are still admitted.
        hold = admission._hold = Hold(0, admission.flow.lane, place=False)
    return hold
