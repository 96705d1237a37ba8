"""How late does the event loop wake up? One sampler (`_Sampler`), kept by
`LoopLagMonitor` (samples for a block of code) and fed to the metrics by
`sample_loop_lag` (forever, nothing kept)."""

from __future__ import annotations

import math
from collections.abc import Callable
from types import TracebackType
from typing import final

import anyio
from anyio.abc import TaskGroup
from typing_extensions import Self

from ._checks import check_positive_number
from ._metrics import _Families, metrics_enabled

#: 10 ms between wake-ups, for both: the lag of a wake-up is measured in full
#: however long the interval, so this only sets how often a stall is caught;
#: a server runs the sampler for months, and at 1 ms it cost the loop about
#: 3.5% of a core against about 0 at 10 ms (an idle asyncio loop, 5 s each).
#: Ask for 1 ms where a short measurement wants many samples.
DEFAULT_INTERVAL = 0.01


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (`q` in [0, 100]); 0.0 if empty."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


@final
class _Sampler:
    """Sleeps `interval` seconds over and over and passes how much later than
    asked each wake-up came to `record`: the time the loop was busy with
    something else. Make it on the loop it samples."""

    __slots__ = ("asleep_since", "interval", "record")

    def __init__(self, interval: float, record: Callable[[float], object]) -> None:
        self.interval = interval
        self.record = record
        # The first sample counts from here, so a loop blocked before the
        # sampler first runs is still seen.
        self.asleep_since = anyio.current_time()

    async def run(self) -> None:
        clock = anyio.current_time
        interval = self.interval
        record = self.record
        while True:
            await anyio.sleep(interval)
            now = clock()
            record(max(0.0, now - self.asleep_since - interval))
            self.asleep_since = now

    def overdue(self) -> float:
        """How late the wake-up still pending is already (<= 0: not yet due)."""
        return anyio.current_time() - self.asleep_since - self.interval


@final
class LoopLagMonitor:
    """Samples event-loop lag while its `async with` block runs.

    A background task sleeps `interval` seconds over and over and records how
    much later than asked it woke up: the time the loop was busy with something
    else (a blocking call, a long callback). Works on asyncio, uvloop and trio.
    """

    def __init__(self, interval: float = DEFAULT_INTERVAL) -> None:
        """A monitor of the loop that enters its block.

        After the block exits, `count`, `p50`, `p99` and `max` (seconds) describe
        the samples; `lags` holds them all. Reading them inside the block gives the
        figures so far. A monitor is single-use. An exception raised in the block
        reaches the caller unchanged (not wrapped in an `ExceptionGroup`).

        Args:
            interval: seconds between wake-ups, > 0. Default 10 ms
                (`DEFAULT_INTERVAL`); a short block of code gets more samples,
                and a finer p99, at 1 ms.
        """
        self.interval = check_positive_number(interval, "interval")
        self._lags: list[float] = []
        self._task_group: TaskGroup | None = None
        self._sampler: _Sampler | None = None

    async def __aenter__(self) -> Self:
        if self._task_group is not None:
            raise RuntimeError("a LoopLagMonitor can be entered only once")
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        self._sampler = _Sampler(self.interval, self._lags.append)
        self._task_group.start_soon(self._sampler.run)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        assert self._task_group is not None
        assert self._sampler is not None
        # The wake-up still pending is overdue if the loop was blocked until now.
        overdue = self._sampler.overdue()
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


async def sample_loop_lag(loop: str = "main", interval: float = DEFAULT_INTERVAL) -> None:
    """Observe the running event loop's lag into `offload_loop_lag_seconds{loop=...}`
    forever (run it as a background task; cancel it to stop).

    The same sampler as `offload.LoopLagMonitor`, with the same default
    interval (10 ms), but it keeps no samples: a server can run it for
    months. Works on asyncio, uvloop and trio. Returns at once, doing
    nothing, when metrics are off.
    """
    interval = check_positive_number(interval, "interval")
    families = _Families.get() if metrics_enabled() else None
    if families is None:
        return
    await _Sampler(interval, families.loop_lag.labels(loop).observe).run()
