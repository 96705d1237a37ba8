"""Admission control and Prometheus metrics: what an executor sees of its calls.

Every metric name starts with `offload_`. They live in `prometheus_client`'s
default registry, so the usual exposition (`prometheus_client.start_http_server`,
`make_asgi_app`, vLLM's own `/metrics`) shows them, multiprocess mode
included. `prometheus_client` is optional (`pip install offload[metrics]`; vLLM
depends on it): without it, or with `OFFLOAD_METRICS=0`, metrics are off and
cost nothing, while admission control (`max_queue`) works the same.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, final

import anyio

from ._call import CANCELLED, DEADLINE, SHUTDOWN, Call
from ._errors import ConfigError, Overloaded, WorkerCrashed

if TYPE_CHECKING:
    from ._executor import Executor

METRICS_ENV = "OFFLOAD_METRICS"

#: Latency buckets (seconds) for queue wait and run time: from a fraction of a
#: millisecond (a hand-off to an idle thread) to 10 s (a call far too long for a
#: request path), roughly x2.5 apart so a p99 reads to within one bucket.
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)

#: Loop-lag buckets (seconds): 1 ms is noise, 10 ms is what a user starts to
#: feel on a `/health` probe, 1 s is a stalled server.
LAG_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

#: Batch-size buckets: powers of two up to the largest useful tokenizer batch.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

#: 10 ms between loop-lag samples: the lag of a wake-up is measured in full
#: however long the interval, so this only sets how often a stall is caught;
#: 100 wake-ups a second cost the loop well under 1% of a core.
DEFAULT_LAG_INTERVAL = 0.01

# (strategy, function) label values are bounded by the functions a program
# offloads; a closure made per call still has one `__qualname__`.
_FUNCTION_LABEL_MAX = 200


def metrics_enabled() -> bool:
    """True when `prometheus_client` is importable and `OFFLOAD_METRICS` is not `0`."""
    if os.environ.get(METRICS_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return False
    return _Families.get() is not None


def function_label(fn: Callable[..., Any]) -> str:
    """The `function` label of a call: `module.qualname` of what was offloaded."""
    inner = getattr(fn, "fn", None)  # a batching strategy's BatchedFunction
    if inner is not None and callable(inner) and type(fn).__name__ == "BatchedFunction":
        fn = inner
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None)
    label = f"{module}.{name}" if module else str(name)
    return label[:_FUNCTION_LABEL_MAX]


@final
class _Families:
    """The metric families, created once per process in the default registry."""

    _instance: _Families | None = None
    _missing = False
    _lock = threading.Lock()

    def __init__(self, prometheus: Any) -> None:
        call = ["strategy", "function"]
        self.queue_wait = prometheus.Histogram(
            "offload_queue_wait_seconds",
            "Time a call waited in the executor's queue before a worker started it.",
            call, buckets=LATENCY_BUCKETS,
        )
        self.run_time = prometheus.Histogram(
            "offload_run_seconds",
            "Time a call ran in its worker (start to result).",
            call, buckets=LATENCY_BUCKETS,
        )
        self.queued = prometheus.Gauge(
            "offload_queued_calls",
            "Calls admitted and waiting for a worker.",
            call, multiprocess_mode="livesum",
        )
        self.running = prometheus.Gauge(
            "offload_running_calls",
            "Calls running in a worker now.",
            call, multiprocess_mode="livesum",
        )
        self.rejected = prometheus.Counter(
            "offload_rejected_calls",
            "Calls refused at admission (reason: overloaded, closed).",
            [*call, "reason"],
        )
        self.dropped = prometheus.Counter(
            "offload_dropped_calls",
            "Admitted calls withdrawn before they started (reason: deadline, cancelled, shutdown).",
            [*call, "reason"],
        )
        self.crashed = prometheus.Counter(
            "offload_crashed_calls",
            "Calls that failed with WorkerCrashed (their worker died under them).",
            call,
        )
        self.restarts = prometheus.Counter(
            "offload_worker_restarts",
            "Workers replaced after they died or were retired.",
            ["strategy", "reason"],
        )
        self.batch_size = prometheus.Histogram(
            "offload_batch_size",
            "Calls run together as one batch by the async-renderer strategy.",
            call, buckets=BATCH_BUCKETS,
        )
        self.loop_lag = prometheus.Histogram(
            "offload_loop_lag_seconds",
            "How late the event loop woke a sleeping task (sampled continuously).",
            ["loop"], buckets=LAG_BUCKETS,
        )

    @classmethod
    def get(cls) -> _Families | None:
        if cls._instance is not None or cls._missing:
            return cls._instance
        with cls._lock:
            if cls._instance is None and not cls._missing:
                try:
                    import prometheus_client
                except ImportError:
                    cls._missing = True
                    return None
                cls._instance = cls(prometheus_client)
        return cls._instance


@final
class _Children:
    """One (strategy, function)'s metric children, looked up once."""

    __slots__ = ("batch_size", "crashed", "dropped", "queue_wait", "queued", "run_time", "running")

    def __init__(self, families: _Families, strategy: str, function: str) -> None:
        self.queue_wait = families.queue_wait.labels(strategy, function)
        self.run_time = families.run_time.labels(strategy, function)
        self.queued = families.queued.labels(strategy, function)
        self.running = families.running.labels(strategy, function)
        self.crashed = families.crashed.labels(strategy, function)
        self.batch_size = families.batch_size.labels(strategy, function)
        self.dropped = {
            reason: families.dropped.labels(strategy, function, reason)
            for reason in (DEADLINE, CANCELLED, SHUTDOWN)
        }


@final
class CallTracker:
    """Per executor: counts calls in flight for `max_queue`, and feeds the metrics.

    A call is in flight from admission until it finishes or is withdrawn; a
    running call whose caller went away still holds its worker, so it still
    counts. Thread-safe: calls move on worker threads and the loop's.
    """

    def __init__(self, strategy: str, capacity: int | None, max_queue: int | None, metrics: bool) -> None:
        self._strategy = strategy
        self._limit = None if max_queue is None or capacity is None else capacity + max_queue
        self._max_queue = max_queue
        self._inflight = 0
        self._lock = threading.Lock()
        self._families = _Families.get() if metrics else None
        self._children: dict[str, _Children] = {}

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def full(self) -> bool:
        return self._limit is not None and self._inflight >= self._limit

    def _labels(self, call: Call[Any]) -> _Children | None:
        children: _Children | None = call.metrics
        if children is not None:
            return children
        families = self._families
        if families is None:
            return None
        name = function_label(call.fn)
        children = self._children.get(name)
        if children is None:
            children = self._children.setdefault(name, _Children(families, self._strategy, name))
        call.metrics = children
        return children

    def admit(self, call: Call[Any], admitted: bool = False) -> None:
        """Count `call` in, or raise `Overloaded` before anything is done for it
        (never when `admitted`: its request was admitted as a whole)."""
        with self._lock:
            if not admitted and self._limit is not None and self._inflight >= self._limit:
                refused = True
            else:
                self._inflight += 1
                refused = False
        if refused:
            self.rejected(function_label(call.fn), "overloaded")
            raise self.overloaded_error()
        call.tracker = self
        children = self._labels(call)
        if children is not None:
            children.queued.inc()

    def hold(self) -> bool:
        """Take one place for an admitted unit of work; False if full."""
        with self._lock:
            if self._limit is not None and self._inflight >= self._limit:
                return False
            self._inflight += 1
            return True

    def unhold(self) -> None:
        with self._lock:
            self._inflight -= 1

    def unadmit(self, call: Call[Any]) -> None:
        """`call` was admitted but the strategy refused it (shutdown began)."""
        call.tracker = None
        with self._lock:
            self._inflight -= 1
        children = self._labels(call)
        if children is not None:
            children.queued.dec()

    def overloaded_error(self) -> Overloaded:
        return Overloaded(
            f"{self._strategy} executor is full: {self._limit} calls in flight "
            f"(its workers' capacity plus max_queue={self._max_queue}); try again later"
        )

    def rejected(self, function: str, reason: str) -> None:
        if self._families is not None:
            self._families.rejected.labels(self._strategy, function, reason).inc()

    def started(self, call: Call[Any]) -> None:
        children = self._labels(call)
        if children is not None:
            children.queued.dec()
            children.running.inc()
            children.queue_wait.observe(call.started_at - call.queued_at)

    def finished(self, call: Call[Any]) -> None:
        with self._lock:
            self._inflight -= 1
        children = self._labels(call)
        if children is not None:
            if call.started_at:
                children.running.dec()
                children.run_time.observe(call.finished_at - call.started_at)
            else:
                children.queued.dec()
            if isinstance(call.error, WorkerCrashed):
                children.crashed.inc()

    def withdrawn(self, call: Call[Any], reason: str) -> None:
        with self._lock:
            self._inflight -= 1
        children = self._labels(call)
        if children is not None:
            children.queued.dec()
            children.dropped[reason].inc()

    def batch(self, calls: list[Call[Any]]) -> None:
        """A batching strategy ran `calls` as one batch."""
        if calls:
            children = self._labels(calls[0])
            if children is not None:
                children.batch_size.observe(len(calls))


def check_max_queue(value: object) -> int | None:
    """Validate `max_queue`: `None` (unbounded) or an `int` >= 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"max_queue must be None (unbounded) or an integer >= 0, got {value!r}")
    return value


def count_worker_restart(executor: Executor, reason: str) -> None:
    """A strategy replaced a worker (`reason`: `crashed` or `retired`)."""
    families = _Families.get() if metrics_enabled() else None
    if families is not None:
        families.restarts.labels(executor.name, reason).inc()


def count_batch(calls: list[Call[Any]]) -> None:
    """A batching strategy ran `calls` together."""
    if calls and calls[0].tracker is not None:
        tracker = calls[0].tracker
        if isinstance(tracker, CallTracker):
            tracker.batch(calls)


async def sample_loop_lag(loop: str = "main", interval: float = DEFAULT_LAG_INTERVAL) -> None:
    """Observe the running event loop's lag into `offload_loop_lag_seconds{loop=...}`
    forever (run it as a background task; cancel it to stop).

    The task sleeps `interval` seconds over and over and records how much later
    than asked it woke up, as `offload.LoopLagMonitor` does, but without keeping
    the samples: a server can run it for months. Works on asyncio, uvloop and
    trio. Returns at once, doing nothing, when metrics are off.
    """
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not interval > 0:
        raise ConfigError(f"interval must be a positive number of seconds, got {interval!r}")
    families = _Families.get() if metrics_enabled() else None
    if families is None:
        return
    observe = families.loop_lag.labels(loop).observe
    clock = anyio.current_time
    asleep_since = clock()
    while True:
        await anyio.sleep(interval)
        now = clock()
        observe(max(0.0, now - asleep_since - interval))
        asleep_since = now

