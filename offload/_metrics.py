"""Prometheus metrics: what an executor's calls, workers and loop show.

Every metric name starts with `offload_`. They live in `prometheus_client`'s
default registry, so the usual exposition (`prometheus_client.start_http_server`,
`make_asgi_app`, vLLM's own `/metrics`) shows them, multiprocess mode
included. `prometheus_client` is optional (`pip install offload[metrics]`; vLLM
depends on it): without it, or with `OFFLOAD_METRICS=0`, metrics are off and
cost nothing, while admission (`_admission.Limiter`, counting and refusing)
works the same. `CallMetrics` holds one executor's metric children: it is the
listener its `Limiter` tells each call's moves.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, final

from ._call import CANCELLED, DEADLINE, SHUTDOWN, Call
from ._errors import WorkerCrashed
from ._fork import reset_in_child
from ._lanes import Lane, Lanes

if TYPE_CHECKING:
    from ._strategy import Strategy

#: Metrics are on unless this says 0/false/no/off. Why: docs/decisions/0014-metrics-on-by-default.md
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

# (strategy, function) label values are bounded by the functions a program
# offloads; a closure made per call still has one `__qualname__`.
_FUNCTION_LABEL_MAX = 200


def metrics_enabled() -> bool:
    """Whether the `offload_*` metrics are on: `prometheus_client` is importable
    and `OFFLOAD_METRICS` is not `0` (nor `false`, `no`, `off`).

    Read from the environment at each call. An extension that feeds metric
    families of its own (an adapter's) checks it, so that `OFFLOAD_METRICS=0`
    turns those off too. Thread-safe."""
    if os.environ.get(METRICS_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return False
    return _Families.get() is not None


def function_label(fn: Callable[..., Any]) -> str:
    """The `function` label of a call: `module.qualname` of what was offloaded
    (of what it wraps, for a wrapper that sets `__wrapped__`, as a batch form does)."""
    inner = getattr(fn, "__wrapped__", None)
    if inner is not None and callable(inner):
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
        call, lane = ["strategy", "function"], ["strategy", "lane"]
        latency = functools.partial(prometheus.Histogram, buckets=LATENCY_BUCKETS)
        # Summed over a multiprocess server's processes, the live ones only.
        gauge = functools.partial(prometheus.Gauge, multiprocess_mode="livesum")
        counter = prometheus.Counter
        self.queue_wait = latency(
            "offload_queue_wait_seconds", "Time a call waited in the executor's queue before a worker started it.", call
        )
        self.run_time = latency("offload_run_seconds", "Time a call ran in its worker (start to result).", call)
        self.queued = gauge("offload_queued_calls", "Calls admitted and waiting for a worker.", call)
        self.running = gauge("offload_running_calls", "Calls running in a worker now.", call)
        self.rejected = counter(
            "offload_rejected_calls", "Calls refused at admission (reason: overloaded, closed).", [*call, "reason"]
        )
        self.dropped = counter(
            "offload_dropped_calls",
            "Admitted calls that offload withdrew before they started, or stopped while "
            "they ran by killing their worker (reason: deadline, cancelled, shutdown).",
            [*call, "reason"],
        )
        self.crashed = counter(
            "offload_crashed_calls", "Calls that failed with WorkerCrashed (their worker died under them).", call
        )
        self.restarts = counter(
            "offload_worker_restarts",
            "Workers replaced after they died, were retired, or were killed by offload "
            "(reason: crashed, retired, killed).",
            ["strategy", "reason"],
        )
        self.batch_size = prometheus.Histogram(
            "offload_batch_size", "Calls run together as one batch by the async-renderer strategy.",
            call, buckets=BATCH_BUCKETS,
        )
        self.lane_queued_cost = gauge(
            "offload_lane_queued_cost", "Cost admitted to a lane and not started yet (requests held, calls queued).", lane
        )
        self.lane_queue_wait = latency(
            "offload_lane_queue_wait_seconds",
            "Time a call of a lane waited in the executor's queue before a worker started it.",
            lane,
        )
        self.lane_rejected = counter(
            "offload_lane_rejected",
            "Calls and requests refused at admission, by lane (reason: overloaded, closed).",
            [*lane, "reason"],
        )
        self.loop_lag = prometheus.Histogram(
            "offload_loop_lag_seconds", "How late the event loop woke a sleeping task (sampled continuously).",
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


@reset_in_child
def _fresh_locks_in_child() -> None:
    """In a child made by `os.fork()`: give offload's metrics fresh locks. A
    thread of the parent may have held one (a worker counting a call) at the
    fork; that thread does not exist here, so the lock would never be released
    and the child's first count would hang."""
    _Families._lock = threading.Lock()
    families = _Families._instance
    if families is None:
        return
    for family in vars(families).values():
        _fresh_lock(family)
        for child in list(getattr(family, "_metrics", {}).values()):
            _fresh_lock(child)
            for value in vars(child).values():
                for part in value if isinstance(value, list) else (value,):
                    _fresh_lock(part)


def _fresh_lock(obj: object) -> None:
    if isinstance(getattr(obj, "_lock", None), type(threading.Lock())):
        obj._lock = threading.Lock()  # type: ignore[attr-defined]


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
class _LaneChildren:
    """One (strategy, lane)'s metric children."""

    __slots__ = ("closed", "overloaded", "queue_wait", "queued_cost")

    def __init__(self, families: _Families, strategy: str, lane: str) -> None:
        self.queued_cost = families.lane_queued_cost.labels(strategy, lane)
        self.queue_wait = families.lane_queue_wait.labels(strategy, lane)
        self.overloaded = families.lane_rejected.labels(strategy, lane, "overloaded")
        self.closed = families.lane_rejected.labels(strategy, lane, "closed")


def call_metrics(strategy: str, lanes: Lanes) -> CallMetrics | None:
    """An executor's metrics (its `Limiter`'s listener); `None` without `prometheus_client`."""
    families = _Families.get()
    return None if families is None else CallMetrics(families, strategy, lanes)


@final
class CallMetrics:
    """One executor's `offload_*` metric children, by function and by lane,
    and what each move of a call shows in them. Thread-safe."""

    def __init__(self, families: _Families, strategy: str, lanes: Lanes) -> None:
        self._families = families
        self._strategy = strategy
        self._children: dict[str, _Children] = {}
        self._lanes = {lane: _LaneChildren(families, strategy, lane.name) for lane in lanes.values()}

    def _of(self, call: Call[Any]) -> _Children:
        children: _Children | None = call.metrics
        if children is None:
            name = function_label(call.fn)
            children = self._children.get(name)
            if children is None:
                children = self._children.setdefault(name, _Children(self._families, self._strategy, name))
            call.metrics = children
        return children

    def lane_cost(self, lane: Lane, cost: float) -> None:
        """`lane`'s queued cost is now `cost`."""
        self._lanes[lane].queued_cost.set(cost)

    def queued(self, call: Call[Any]) -> None:
        """`call` was admitted."""
        self._of(call).queued.inc()

    def unqueued(self, call: Call[Any]) -> None:
        """`call` was admitted, then not taken (the strategy refused it)."""
        self._of(call).queued.dec()

    def started(self, call: Call[Any]) -> None:
        wait = call.started_at - call.queued_at
        self._lanes[call.lane].queue_wait.observe(wait)
        children = self._of(call)
        children.queued.dec()
        children.running.inc()
        children.queue_wait.observe(wait)

    def finished(self, call: Call[Any]) -> None:
        children = self._of(call)
        if call.started_at:
            children.running.dec()
            children.run_time.observe(call.finished_at - call.started_at)
        else:
            children.queued.dec()
        if call.stopped_by is not None:
            # offload killed its worker on purpose: not a crash.
            children.dropped[call.stopped_by].inc()
        elif isinstance(call.error, WorkerCrashed):
            children.crashed.inc()

    def withdrawn(self, call: Call[Any], reason: str) -> None:
        children = self._of(call)
        children.queued.dec()
        children.dropped[reason].inc()

    def refused(self, function: str, lane: Lane, reason: str) -> None:
        """A call or unit of work of `function` in `lane` was refused for `reason`."""
        self._families.rejected.labels(self._strategy, function, reason).inc()
        children = self._lanes[lane]
        (children.overloaded if reason == "overloaded" else children.closed).inc()

    def batch(self, calls: list[Call[Any]]) -> None:
        """A batching strategy ran `calls` as one batch."""
        self._of(calls[0]).batch_size.observe(len(calls))


def count_worker_restart(strategy: Strategy, reason: str) -> None:
    """For strategies: a worker of `strategy` was replaced. Feeds
    `offload_worker_restarts_total{strategy=strategy.name, reason=reason}`.

    Args:
        strategy: the `offload.strategy.Strategy` itself (`self` in its
            methods), not its name.
        reason: `"crashed"`, `"retired"`, or `"killed"` when offload killed
            it on purpose.
    """
    if isinstance(strategy, str):
        raise TypeError(
            f"count_worker_restart takes the strategy (self), not its name; got {strategy!r}"
        )
    families = _Families.get() if metrics_enabled() else None
    if families is not None:
        families.restarts.labels(strategy.name, reason).inc()
