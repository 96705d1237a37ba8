"""`ray`: long-lived actors of a Ray cluster, fed from a queue on the caller's side."""

from __future__ import annotations

import itertools
import os
import queue
import threading
from collections.abc import Callable, Mapping
from typing import Any, final

import ray
import ray.exceptions

import offload

from ._actor import RayWorker

#: Arguments of at least this many bytes (`bytes`, `bytearray`, NumPy arrays,
#: anything with an integer `nbytes`) are put in the object store once and
#: passed by reference. 100 KiB is Ray's own limit for inlining an argument in
#: the task message (`max_direct_call_object_size`), so smaller values would
#: only gain a round trip to the store.
DEFAULT_OBJECT_STORE_THRESHOLD = 100 << 10

#: How long an actor may take to be placed and run its initializer. Long enough
#: for a cold worker process that imports a tokenizer on a busy node; an actor
#: that asks for resources no node has would otherwise wait forever.
DEFAULT_ACTOR_START_TIMEOUT = 120.0

_pool_ids = itertools.count()
# `ray.init` is process-wide: two executors must not race to start it.
_connect_lock = threading.Lock()


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise offload.ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


def _positive_number(name: str, value: object, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise offload.ConfigError(f"{name} must be a number, got {value!r}")
    if not (value >= 0 if allow_zero else value > 0) or value == float("inf"):
        raise offload.ConfigError(
            f"{name} must be a finite number {'>= 0' if allow_zero else '> 0'}, got {value!r}"
        )
    return float(value)


def _nbytes(value: object) -> int | None:
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, memoryview):
        return value.nbytes
    size = getattr(value, "nbytes", None)
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def _call_name(call: offload.Call[Any]) -> str:
    return getattr(call.fn, "__qualname__", None) or repr(call.fn)


def _rebuild_error(payload: tuple[BaseException | None, str]) -> BaseException:
    exception, text = payload
    if exception is not None:
        return exception
    return offload.OffloadError(
        "the offloaded function raised an exception that cannot be pickled; "
        f"its traceback in the actor:\n{text}"
    )


@final
class _Slot:
    """One actor at a time, driven by one thread of this process."""

    def __init__(self, pool: RayExecutor, number: int) -> None:
        self.pool = pool
        self.actor: Any = None
        self.start_error: BaseException | None = None
        #: Set once the slot's first actor started (or failed to).
        self.ready = threading.Event()
        #: The call this slot's actor runs now (for `aclose(timeout=...)`).
        self.current: offload.Call[Any] | None = None
        self.thread = threading.Thread(target=self.serve, name=f"{pool._name}-{number}", daemon=True)

    def serve(self) -> None:
        pool = self.pool
        try:
            # Up front, so the pool is at full strength before the calls that follow
            # the first; a failure is reported to the first call this slot takes.
            try:
                self.actor = pool._new_actor()
            except BaseException as exc:
                with pool._lock:
                    self.start_error = exc
            finally:
                self.ready.set()
            while True:
                call = pool._queue.get()
                if call is None:
                    return
                with pool._lock:
                    pool._queued -= 1
                if call.claim():
                    with pool._lock:
                        self.current = call
                    try:
                        self.run(call)
                    finally:
                        with pool._lock:
                            self.current = None
                del call  # don't keep the last call's arguments alive while idle
        finally:
            self.retire()

    def run(self, call: offload.Call[Any]) -> None:
        pool = self.pool
        if self.actor is None:
            with pool._lock:
                error, self.start_error = self.start_error, None
            if error is not None:
                call.set_exception(error)
                return
            try:
                self.actor = pool._new_actor()
            except BaseException as exc:
                call.set_exception(exc)
                return
        try:
            args, kwargs, stored = pool._by_reference(call.args, call.kwargs)
            ref = self.actor.run.remote(call.fn, *args, **kwargs)
        except Exception as exc:
            error = TypeError(
                f"ray strategy: the call {_call_name(call)}() could not be sent to an actor "
                f"({type(exc).__name__}: {exc}); its function and arguments must be serializable"
            )
            error.__cause__ = exc
            call.set_exception(error)
            return
        try:
            status, value = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            # Dropped before the caller hears of it, so nothing that runs on that
            # news (a retry, `_actors()`) still sees the dead actor as live.
            self.retire()
            call.set_exception(
                offload.WorkerCrashed(f"ray actor died while running {_call_name(call)}(): {exc}")
            )
            self.replace()
            return
        except ray.exceptions.RayError as exc:
            # The reply could not be made or fetched (an unserializable result, a lost object).
            error = offload.OffloadError(
                f"ray strategy: the result of {_call_name(call)}() could not be returned: {exc}"
            )
            error.__cause__ = exc
            call.set_exception(error)
            return
        finally:
            del ref, args, kwargs, stored
        if status == "ok":
            call.set_result(value)
        else:
            call.set_exception(_rebuild_error(value))

    def replace(self) -> None:
        """Drop the dead actor and start its successor now, so the pool keeps its
        size (a failure here is retried by the next call)."""
        self.retire()
        if self.pool._stopping:
            return
        try:
            self.actor = self.pool._new_actor()
        except BaseException:
            self.actor = None

    def retire(self) -> None:
        actor, self.actor = self.actor, None
        if actor is not None:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: S110 (already gone, or Ray is shutting down)
                pass


@final
class RayExecutor(offload.Executor):
    """Runs calls on `max_workers` long-lived actors of a Ray cluster.

    Use it when pre-processing outgrows one host: image and video decoding,
    long-document chunking and tokenization feeding many GPUs. On one host,
    `process` does the same job with less overhead per call.

    **Where calls wait.** Calls queue here, on the caller's side, in FIFO order,
    and each actor is sent one call at a time, only when it is idle: a call
    cancelled before it starts never reaches the cluster. The event loop never
    calls Ray: one thread of this process drives each actor (so Ray's own
    asyncio integration, and its open uvloop issue, never touch the caller's
    loop; asyncio, uvloop and trio behave the same).

    **What crosses.** The function and its arguments are serialized by Ray
    (cloudpickle: module-level functions, lambdas and closures alike); the
    result or exception comes back. Arguments of `object_store_threshold` bytes
    or more are put in the object store once (`ray.put`), and NumPy arrays
    arrive in the actor as read-only zero-copy views of it. An exception
    reaches the caller with its own type and message and the function's frames
    (tblib); one that cannot be pickled becomes `OffloadError` with its
    traceback text. `contextvars` do not cross.

    **Crashes.** If an actor dies while running a call (its process killed, its
    node lost), that call raises `WorkerCrashed`, and a fresh actor takes its
    place (wherever the cluster has room), so the pool keeps its size. An actor
    that died while idle fails the next call sent to it the same way.

    **Cancellation.** Cancelling the caller of a running call returns at once;
    the call finishes on its actor (Ray cannot interrupt a synchronous actor
    task: `ray.cancel` does not reach it), which stays busy until then, and its
    result is dropped.

    **Lifetime.** Nothing happens at construction. `start()`, or else the
    first call, connects to Ray (`ray.init(address=address,
    **ray_init_options)`, unless this process is already connected) and starts
    every actor. `shutdown()` kills the actors; the Ray connection (and a local
    instance it started) stays for the rest of the process, as with any other
    Ray user code. `aclose(timeout=...)` kills the actors still running a call
    when the timeout passes (their callers get `WorkerCrashed`).

    Args:
        max_workers: the number of actors (and of concurrent calls). `None`:
            `OFFLOAD_MAX_WORKERS`, else the number of CPUs this process may use.
        initializer: run once in each actor, before its first call; its return
            value is that actor's `offload.worker_state()`. If it raises, the
            call that started the actor fails with `OffloadError` (the cause
            attached) and the next call starts a fresh actor.
        initargs: positional arguments for `initializer`.
        address: the cluster to join when this process is not yet connected:
            `"auto"` (a cluster started with `ray start` on this host),
            `"ray://host:port"` (Ray Client), an IP and port, or `None`: a
            cluster named by `RAY_ADDRESS`, else a new local instance.
        num_cpus: CPUs each actor reserves (fractions allowed). Default 1.
        resources: custom resources each actor reserves, e.g. `{"preprocess": 1}`.
        scheduling_strategy: where actors go: `"DEFAULT"`, `"SPREAD"` (one per
            node in turn), or a Ray scheduling strategy object
            (`NodeAffinitySchedulingStrategy`, `PlacementGroupSchedulingStrategy`).
        object_store_threshold: arguments of at least this many bytes go
            through the object store; `None` leaves it to Ray.
        actor_start_timeout: seconds an actor may take to be placed and
            initialized before the call waiting for it fails with `OffloadError`
            (no node has the resources asked for).
        ray_init_options: extra keyword arguments for `ray.init` when this
            executor starts the connection (`num_cpus`, `object_store_memory`, ...).
        max_queue: calls that may wait for a busy actor before new ones fail
            with `offload.Overloaded`. `None` (default): unbounded.
    """

    name = "ray"
    carries_context = False

    def __init__(
        self,
        max_workers: int | None = None,
        *,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
        address: str | None = None,
        num_cpus: float = 1.0,
        resources: Mapping[str, float] | None = None,
        scheduling_strategy: Any = None,
        object_store_threshold: int | None = DEFAULT_OBJECT_STORE_THRESHOLD,
        actor_start_timeout: float = DEFAULT_ACTOR_START_TIMEOUT,
        ray_init_options: Mapping[str, Any] | None = None,
        max_queue: int | None = None,
    ) -> None:
        if max_workers is None:
            max_workers = max(1, len(os.sched_getaffinity(0)))
        self._max_workers = _positive_int("max_workers", max_workers)
        if initializer is not None and not callable(initializer):
            raise offload.ConfigError(f"initializer must be callable or None, got {initializer!r}")
        if not isinstance(initargs, tuple):
            raise offload.ConfigError(f"initargs must be a tuple, got {type(initargs).__name__}")
        if address is not None and not (isinstance(address, str) and address.strip()):
            raise offload.ConfigError(
                f"address must be 'auto', 'ray://host:port', 'host:port' or None, got {address!r}"
            )
        self._num_cpus = _positive_number("num_cpus", num_cpus, allow_zero=True)
        if resources is not None:
            if not isinstance(resources, Mapping):
                raise offload.ConfigError(f"resources must be a mapping of name to amount, got {resources!r}")
            for key, amount in resources.items():
                if not isinstance(key, str):
                    raise offload.ConfigError(f"resource names must be strings, got {key!r}")
                _positive_number(f"resources[{key!r}]", amount, allow_zero=True)
        if object_store_threshold is not None:
            _positive_int("object_store_threshold", object_store_threshold)
        self._actor_start_timeout = _positive_number("actor_start_timeout", actor_start_timeout)
        if ray_init_options is not None and not isinstance(ray_init_options, Mapping):
            raise offload.ConfigError(f"ray_init_options must be a mapping, got {ray_init_options!r}")
        self._initializer = initializer
        self._initargs = initargs
        self._address = address
        self._resources = dict(resources or {})
        self._scheduling_strategy = scheduling_strategy
        self._threshold = object_store_threshold
        self._ray_init_options = dict(ray_init_options or {})
        self._name = f"offload-ray-{next(_pool_ids)}"
        self._queue: queue.SimpleQueue[offload.Call[Any] | None] = queue.SimpleQueue()
        self._queued = 0  # calls in the queue (stop signals not counted)
        self._slots: list[_Slot] = []
        self._stopping = False
        self._lock = threading.Lock()
        self._actor_class: Any = None
        self._set_max_queue(max_queue)

    @property
    def max_workers(self) -> int:
        return self._max_workers

    def start(self) -> None:
        """Connect to Ray and start every actor now; return once each has run
        its initializer. Idempotent. Raises `ExecutorClosed` after shutdown,
        and the first actor's start-up error (`OffloadError` for a failing
        initializer or no room in the cluster within `actor_start_timeout`,
        `WorkerCrashed` for an actor that died): the actors that did start
        stay, and the failed ones are retried by the calls that follow.
        Blocks: from async code, `await anyio.to_thread.run_sync(ex.start)`."""
        with self._lock:
            if self._stopping or self.closed:
                raise offload.ExecutorClosed("RayExecutor is shut down")
            self._start_slots()
            slots = list(self._slots)
        for slot in slots:
            slot.ready.wait()
        for slot in slots:
            with self._lock:
                error, slot.start_error = slot.start_error, None
            if error is not None:
                raise error

    # ---- the strategy's hooks ----------------------------------------------

    def _capacity(self) -> int:
        return self._max_workers

    def _start_slots(self) -> None:
        # Every actor at once: connecting to Ray and placing actors is slow,
        # and a pool that grew call by call would pay it under load.
        if not self._slots:
            self._slots = [_Slot(self, n) for n in range(self._max_workers)]
            for slot in self._slots:
                slot.thread.start()

    def _schedule(self, call: offload.Call[Any]) -> None:
        with self._lock:
            if self._stopping:
                raise offload.ExecutorClosed("RayExecutor is shut down")
            self._queue.put(call)
            self._queued += 1
            self._start_slots()

    def _terminate_running(self) -> bool:
        # Ray cannot interrupt a synchronous actor task: kill the actors that
        # still run one. Their callers get `WorkerCrashed`; no successor starts
        # (the pool is stopping), so every slot's thread exits promptly.
        with self._lock:
            busy = [slot.actor for slot in self._slots if slot.current is not None and slot.actor is not None]
        for actor in busy:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: S110, PERF203 (already gone; one per actor)
                pass
        return True

    def _shutdown(self, wait: bool, cancel_futures: bool) -> None:
        dropped: list[offload.Call[Any]] = []
        with self._lock:
            if cancel_futures:
                stop_signals = 0
                while True:
                    try:
                        pending = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if pending is None:
                        stop_signals += 1  # from an earlier shutdown: put back
                    else:
                        self._queued -= 1
                        dropped.append(pending)
                for _ in range(stop_signals):
                    self._queue.put(None)
            if not self._stopping:
                self._stopping = True
                for _ in self._slots:
                    self._queue.put(None)
            threads = [slot.thread for slot in self._slots]
        # Outside the lock: a dropped future's callbacks may call back in here.
        for call in dropped:
            call.drop()
        if wait:
            me = threading.current_thread()
            for thread in threads:
                if thread is not me:
                    thread.join()

    # ---- actors --------------------------------------------------------------

    def _connect(self) -> None:
        with _connect_lock:
            if not ray.is_initialized():
                ray.init(address=self._address, **self._ray_init_options)
            if self._actor_class is None:
                self._actor_class = ray.remote(RayWorker)

    def _new_actor(self) -> Any:
        """Start an actor and wait for its initializer; raise what prevented it."""
        self._connect()
        options: dict[str, Any] = {"num_cpus": self._num_cpus, "max_restarts": 0}
        if self._resources:
            options["resources"] = self._resources
        if self._scheduling_strategy is not None:
            options["scheduling_strategy"] = self._scheduling_strategy
        actor = self._actor_class.options(**options).remote(self._initializer, self._initargs)
        try:
            init_error = ray.get(actor.ready.remote(), timeout=self._actor_start_timeout)
        except ray.exceptions.GetTimeoutError:
            ray.kill(actor, no_restart=True)
            raise offload.OffloadError(
                f"ray strategy: no actor started within {self._actor_start_timeout:g} s; does any "
                f"node have num_cpus={self._num_cpus:g}"
                + (f" and resources {self._resources}" if self._resources else "")
                + " free?"
            ) from None
        except ray.exceptions.RayActorError as exc:
            raise offload.WorkerCrashed(f"ray actor died while starting: {exc}") from exc
        if init_error is not None:
            ray.kill(actor, no_restart=True)
            cause = _rebuild_error(init_error)
            error = offload.OffloadError(f"worker initializer {self._initializer!r} failed: {cause!r}")
            error.__cause__ = cause
            raise error
        return actor

    def _by_reference(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any], list[Any]]:
        """Large top-level arguments replaced by object references (Ray resolves
        those before the actor method runs); the references are returned too, so
        the caller keeps them alive until the call is over."""
        threshold = self._threshold
        if threshold is None:
            return args, kwargs, []
        stored: list[Any] = []

        def place(value: Any) -> Any:
            size = _nbytes(value)
            if size is None or size < threshold:
                return value
            ref = ray.put(value)
            stored.append(ref)
            return ref

        return (
            tuple(place(a) for a in args),
            {k: place(v) for k, v in kwargs.items()},
            stored,
        )

    def _actors(self) -> list[Any]:
        """The live actor handles (for tests and diagnostics)."""
        with self._lock:
            return [slot.actor for slot in self._slots if slot.actor is not None]
