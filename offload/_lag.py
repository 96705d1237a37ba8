"""`LoopLagMonitor`: how late does the event loop wake up?"""

from __future__ import annotations

import math
from types import TracebackType
from typing import final

import anyio
from anyio.abc import TaskGroup
from typing_extensions import Self

from ._errors import ConfigError

#: 1 ms: fine enough to see a single blocked tokenizer call (a few ms), coarse
#: enough that the sampler itself costs well under 1% of a core.
DEFAULT_INTERVAL = 0.001


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (`q` in [0, 100]); 0.0 if empty."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


@final
class LoopLagMonitor:
    """Samples event-loop lag while its `async with` block runs.

    A background task sleeps `interval` seconds over and over and records how
    much later than asked it woke up: the time the loop was busy with something
    else (a blocking call, a long callback). Works on asyncio, uvloop and trio.

    After the block exits, `count`, `p50`, `p99` and `max` (seconds) describe
    the samples; `lags` holds them all. Reading them inside the block gives the
    figures so far. A monitor is single-use. An exception raised in the block
    reaches the caller unchanged (not wrapped in an `ExceptionGroup`).

    Args:
        interval: seconds between wake-ups, > 0. Default 1 ms.
    """

    def __init__(self, interval: float = DEFAULT_INTERVAL) -> None:
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not interval > 0:
            raise ConfigError(f"interval must be a positive number of seconds, got {interval!r}")
        self.interval = float(interval)
        self._lags: list[float] = []
        self._task_group: TaskGroup | None = None
        self._used = False
        self._asleep_since = 0.0

    async def _sample(self) -> None:
        clock = anyio.current_time
        interval = self.interval
        append = self._lags.append
        while True:
            await anyio.sleep(interval)
            now = clock()
            append(max(0.0, now - self._asleep_since - interval))
            self._asleep_since = now

    async def __aenter__(self) -> Self:
        if self._used:
            raise RuntimeError("a LoopLagMonitor can be entered only once")
        self._used = True
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        # The first sample counts from here, so a loop blocked before the
        # sampler first runs is still seen.
        self._asleep_since = anyio.current_time()
        self._task_group.start_soon(self._sample)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        assert self._task_group is not None
        # The wake-up still pending is overdue if the loop was blocked until now.
        overdue = anyio.current_time() - self._asleep_since - self.interval
        if overdue > 0:
            self._lags.append(overdue)
        self._task_group.cancel_scope.cancel()
        if exc_val is None or isinstance(exc_val, anyio.get_cancelled_exc_class()):
            return await self._task_group.__aexit__(exc_type, exc_val, exc_tb)
        # The body's own exception must reach the caller as it is: handed to
        # the task group, it would come back wrapped in an ExceptionGroup.
        await self._task_group.__aexit__(None, None, None)
        return None

    @property
    def lags(self) -> tuple[float, ...]:
        """Every lag sample, in seconds, in the order taken."""
        return tuple(self._lags)

    @property
    def count(self) -> int:
        return len(self._lags)

    @property
    def p50(self) -> float:
        return percentile(sorted(self._lags), 50)

    @property
    def p99(self) -> float:
        return percentile(sorted(self._lags), 99)

    @property
    def max(self) -> float:
        return max(self._lags, default=0.0)

    def __repr__(self) -> str:
        return (
            f"<LoopLagMonitor count={self.count} p50={self.p50 * 1e3:.2f}ms "
            f"p99={self.p99 * 1e3:.2f}ms max={self.max * 1e3:.2f}ms>"
        )
