"""`ray`: long-lived actors of a Ray cluster, fed from offload's queue on the caller's side.

Built on offload's public strategy interface only (`offload.strategy`): the
queue, the slot threads, start-up and shutdown are `Dispatcher`'s; this module
is what one slot does with its actor.
"""

from __future__ import annotations

import gc
import itertools
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, final

import ray
import ray.exceptions
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

import offload
from offload.strategy import (
    SHUTDOWN,
    Call,
    Dispatcher,
    Strategy,
    check_initializer,
    check_max_workers,
    count_worker_restart,
    initializer_failed,
    usable_cpu_count,
)

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

#: How long `shutdown(wait=True)` waits for the actors it killed to be dead and
#: for the cluster to count their resources as free again. Ray frees them within
#: a fraction of a second; a node that stopped answering takes Ray up to its
#: health-check period (about 30 s) to declare dead.
DEFAULT_ACTOR_STOP_TIMEOUT = 60.0

#: Resource amounts closer than this are equal: Ray counts resources in
#: units of 1/10000.
_RESOURCE_SLACK = 0.5e-4

_T = TypeVar("_T")

logger = logging.getLogger("offload_ray")

_pool_ids = itertools.count()


def _number(name: str, value: object, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise offload.ConfigError(f"{name} must be a number, got {value!r}")
    if not (value >= 0 if allow_zero else value > 0) or value == math.inf:
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


def _call_name(call: Call[Any]) -> str:
    return getattr(call.fn, "__qualname__", None) or repr(call.fn)


def _rebuild_error(payload: tuple[BaseException | None, str]) -> BaseException:
    exception, text = payload
    if exception is not None:
        return exception
    return offload.OffloadError(
        "the offloaded function raised an exception that cannot be pickled; "
        f"its traceback in the actor:\n{text}"
    )


# ---- connecting -------------------------------------------------------------------
#
# Ray binds the processes `ray.init` starts (a local GCS and raylet) to the
# thread that started them (`prctl(PR_SET_PDEATHSIG)` fires when that *thread*
# exits): started from a slot thread, they would die at the first shutdown and
# take the program down with them. So every connection is made by one thread
# that lives as long as the process.

_connect_requests: queue.SimpleQueue[tuple[Callable[[], None], Any]] = queue.SimpleQueue()
_connector: threading.Thread | None = None
_connector_lock = threading.Lock()
#: True in a child forked from a process connected to Ray: it has Ray's
#: state but not the connection (Ray does not support fork).
_inherited_connection = False


def _serve_connections() -> None:
    while True:
        connect, reply = _connect_requests.get()
        try:
            connect()
        except BaseException as exc:
            reply.put(exc)
        else:
            reply.put(None)


def _connect(address: str | None, options: Mapping[str, Any]) -> None:
    """Connect this process to Ray (once), on the connector thread."""
    global _connector
    if _inherited_connection and ray.is_initialized():
        raise offload.OffloadError(
            "ray strategy: this process was forked from one connected to Ray, and Ray's "
            "connection does not survive os.fork(); use Ray from a process that did not "
            "inherit a connection (connect after forking, or spawn)"
        )
    if ray.is_initialized():
        return
    with _connector_lock:
        if _connector is None or not _connector.is_alive():
            _connector = threading.Thread(target=_serve_connections, name="offload-ray-connect", daemon=True)
            _connector.start()

    def connect() -> None:
        if not ray.is_initialized():
            ray.init(address=address, **options)

    reply: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
    _connect_requests.put((connect, reply))
    error = reply.get()
    if error is not None:
        raise error


#: Ray jobs (connections) of this process that were connected when it forked.
#: A child that releases Ray objects it inherited (object refs, actor
#: handles) speaks on the parent's connections; with Ray 2.60 the parent's
#: GCS then stopped answering (`ray.available_resources()` never returned, no
#: new actor started) or Ray aborted it. Children forked with offload loaded
#: no longer do that (`_after_fork_in_child`), but a child's own code still
#: can, so shutdown does not wait on the GCS in such a parent.
_forked_jobs: set[str] = set()

#: In a child: the parent's pools (slots, actor handles, killed actors), kept
#: so that dropping them never releases the parent's actors through Ray.
_parents_pools: list[dict[str, Any]] = []


def _current_job() -> str | None:
    try:
        return str(ray.get_runtime_context().get_job_id()) if ray.is_initialized() else None
    except Exception:  # Ray going away: no job
        return None


def _after_fork_in_parent() -> None:
    job = _current_job()
    if job is not None:
        _forked_jobs.add(job)


def _gcs_answers() -> bool:
    """Whether shutdown may wait on Ray's GCS (actor deaths, free resources):
    not in a process that forked while on its current connection."""
    return ray.is_initialized() and _current_job() not in _forked_jobs


def _after_fork_in_child() -> None:
    # The connector thread is the parent's; so is the connection.
    global _connector, _connect_requests, _connector_lock, _inherited_connection
    _connector = None
    _connect_requests = queue.SimpleQueue()
    _connector_lock = threading.Lock()
    _inherited_connection = ray.is_initialized()
    if _inherited_connection:
        # The child's cycle collector would finalize Ray objects inherited from
        # the parent, and their finalizers tell Ray, on the parent's
        # connections, that the parent released them. Frozen objects are never
        # collected (they stay, shared copy-on-write, as after any fork).
        gc.freeze()


if hasattr(os, "register_at_fork"):  # pragma: no branch (every POSIX Python)
    os.register_at_fork(after_in_child=_after_fork_in_child, after_in_parent=_after_fork_in_parent)


# ---- the strategy --------------------------------------------------------------------


@final
class _Slot:
    """One slot's actor. `actor`, `killed` and `held` change under the dispatcher's lock."""

    __slots__ = ("actor", "held", "killed", "number")

    def __init__(self, number: int) -> None:
        self.number = number
        self.actor: Any = None
        #: offload killed (or is killing) its actor on purpose.
        self.killed = False
        #: `actor` answered (ready, or its initializer failed): its constructor
        #: ran, so its node had granted its reservation.
        self.held = False


@final
class RayStrategy(Strategy):
    """Runs calls on `max_workers` long-lived actors of a Ray cluster.

    Use it when pre-processing outgrows one host: image and video decoding,
    long-document chunking and tokenization feeding many GPUs. On one host,
    `process` does the same job with less overhead per call.

    **Where calls wait.** Calls queue here, on the caller's side, in offload's
    queue (fair by lane, flow and cost, as for every strategy), and each
    actor is sent one call at a time, only when it is idle: a call cancelled
    before it starts never reaches the cluster. The event loop never calls
    Ray: one thread of this process drives each actor (so Ray's own asyncio
    integration, and its open uvloop issue, never touch the caller's loop;
    asyncio, uvloop and trio behave the same).

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
    every actor. The connection is made by one thread that lives as long as
    the process, so a local Ray instance it starts lives as long as the
    process too, through any number of executors. `shutdown()` kills the
    actors. `aclose(timeout=...)` kills the actors still running a call, or
    still starting, when the timeout passes (their callers get `WorkerCrashed`).
    With `wait`, `shutdown()` returns once Ray reports every actor it killed
    dead and the cluster's resource view (`ray.available_resources()`) counts
    their reservations as free again (every actor that had answered, also one
    still starting when shutdown began), so a pool started next can take them
    at once; if that takes longer than `actor_stop_timeout` seconds, it logs a
    warning (logger `offload_ray`) saying what is still held and returns; if
    Ray's GCS does not answer, shutdown returns all the same, within
    `actor_stop_timeout` plus 10 s. Actors
    placed in a placement group give their resources back to the group, not
    to the cluster: for those it waits until they are dead only.

    **Fork.** Ray's connection does not survive `os.fork()`: in a child of a
    process connected to Ray, calls fail with `OffloadError` saying so. The
    child never releases the Ray objects it inherited (the parent's pools are
    kept, and `gc.freeze()` keeps its garbage collector off them): their
    finalizers speak on the parent's connections and broke the parent's Ray
    (Ray 2.60: no new actor started, its GCS stopped answering, or Ray aborted
    it). A child's own code can still release such objects, so in a process
    that forked while connected `shutdown(wait=True)` kills the actors and
    returns without waiting for their death or resources.

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
        actor_stop_timeout: seconds `shutdown(wait=True)` waits for the actors
            it killed to be dead and their resources free (see Lifetime).
        ray_init_options: extra keyword arguments for `ray.init` when this
            executor starts the connection (`num_cpus`, `object_store_memory`, ...).
    """

    name = "ray"
    #: Calls run in actor processes: `contextvars` do not cross.
    carries_context = False
    #: An actor that dies mid-call fails that call (`WorkerCrashed`) and is replaced.
    replaces_crashed_workers = True

    def __init__(
        self,
        max_workers: int | None = None,
        *,
        address: str | None = None,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
        num_cpus: float = 1.0,
        resources: Mapping[str, float] | None = None,
        scheduling_strategy: Any = None,
        object_store_threshold: int | None = DEFAULT_OBJECT_STORE_THRESHOLD,
        actor_start_timeout: float = DEFAULT_ACTOR_START_TIMEOUT,
        actor_stop_timeout: float = DEFAULT_ACTOR_STOP_TIMEOUT,
        ray_init_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._max_workers = usable_cpu_count() if max_workers is None else check_max_workers(max_workers)
        check_initializer(initializer, initargs)
        if address is not None and not (isinstance(address, str) and address.strip()):
            raise offload.ConfigError(
                f"address must be 'auto', 'ray://host:port', 'host:port' or None, got {address!r}"
            )
        self._num_cpus = _number("num_cpus", num_cpus, allow_zero=True)
        if resources is not None:
            if not isinstance(resources, Mapping):
                raise offload.ConfigError(f"resources must be a mapping of name to amount, got {resources!r}")
            for key, amount in resources.items():
                if not isinstance(key, str):
                    raise offload.ConfigError(f"resource names must be strings, got {key!r}")
                _number(f"resources[{key!r}]", amount, allow_zero=True)
        if object_store_threshold is not None:
            check_max_workers(object_store_threshold, source="object_store_threshold")
        self._actor_start_timeout = _number("actor_start_timeout", actor_start_timeout)
        self._actor_stop_timeout = _number("actor_stop_timeout", actor_stop_timeout)
        if ray_init_options is not None and not isinstance(ray_init_options, Mapping):
            raise offload.ConfigError(f"ray_init_options must be a mapping, got {ray_init_options!r}")
        self._initializer = initializer
        self._initargs = initargs
        self._address = address
        self._resources = dict(resources or {})
        self._scheduling_strategy = scheduling_strategy
        self._threshold = object_store_threshold
        self._ray_init_options = dict(ray_init_options or {})
        self._pool = f"offload-ray-{next(_pool_ids)}"
        self._actor_class: Any = None
        self._new_pool()

    def _new_pool(self) -> None:
        self._dispatch: Dispatcher[_Slot] = Dispatcher(
            self.name, self._max_workers, self, thread_name=self._pool
        )
        self._stopping = False
        self._terminating = False
        #: Set when shutdown begins: the cluster's free resources then
        #: (`None`: no actor then, Ray going away, or its GCS not answering).
        self._free_at_stop: dict[str, float] | None = None
        #: The actors killed since shutdown began, each with whether it held
        #: its reservation, until `shutdown(wait=True)` has waited for them.
        self._stopped: list[tuple[Any, bool]] = []

    def actors(self) -> list[Any]:
        """The live actor handles (for tests and diagnostics)."""
        return [slot.actor for slot in self._dispatch.slots() if slot.actor is not None]

    def capacity(self) -> int:
        return self._max_workers

    @property
    def max_workers(self) -> int:
        return self._max_workers

    # ---- the strategy ----------------------------------------------------------------

    def schedule(self, call: Call[Any]) -> None:
        self._dispatch.put(call)
        # Every actor at once: connecting to Ray and placing actors is slow,
        # and a pool that grew call by call would pay it under load.
        self._dispatch.grow()

    def start(self) -> None:
        self._dispatch.start_all()

    def terminate_running(self) -> bool:
        # Ray cannot interrupt a synchronous actor task: kill the actors still
        # running one, or still starting. Their callers get `WorkerCrashed`; no
        # successor starts (the pool is stopping), so every slot exits promptly.
        # Set first: an actor that a slot is starting now is killed by the slot.
        self._terminating = True
        for _, call in self._dispatch.running():
            call.stop(SHUTDOWN)
        for slot in self._dispatch.slots():
            with self._dispatch.lock:
                actor = slot.actor
                slot.killed = slot.killed or actor is not None
            if actor is not None:
                _kill(actor)
        return True

    def shutdown(self, wait: bool, cancel_futures: bool) -> None:
        if not self._stopping:
            # Before any actor is killed: what they hold is not free yet. An
            # actor still starting counts: it may hold its reservation already.
            slots = self._dispatch.slots()
            with self._dispatch.lock:
                has_actors = any(s.actor is not None for s in slots)
            if has_actors and _gcs_answers():
                self._free_at_stop = _answer_within(
                    ray.available_resources, min(_GCS_GRACE, self._actor_stop_timeout)
                )
        self._stopping = True
        self._dispatch.close(cancel_futures)
        if wait:
            self._dispatch.join()
            self._await_release()

    def _await_release(self) -> None:
        """Wait until the actors killed since shutdown began are dead and the
        cluster counts what they held as free again, or `actor_stop_timeout`."""
        with self._dispatch.lock:
            stopped, self._stopped = self._stopped, []
        if not stopped or not _gcs_answers():
            return
        deadline = time.monotonic() + self._actor_stop_timeout
        # Ray's calls here go through its GCS and have no timeout of their own:
        # one the GCS never answers would hold shutdown forever.
        def wait() -> bool:
            self._wait_for_release(stopped, deadline)
            return True

        if _answer_within(wait, self._actor_stop_timeout + _GCS_GRACE) is None:
            logger.warning(
                "ray strategy: shutdown waited %g s and Ray's GCS did not answer whether its "
                "%d actors are dead and their resources free; returning",
                self._actor_stop_timeout, len(stopped),
            )

    def _wait_for_release(self, stopped: list[tuple[Any, bool]], deadline: float) -> None:
        alive = [actor for actor, _ in stopped if not _dead_by(actor, deadline)]
        if alive:
            logger.warning(
                "ray strategy: shutdown waited %g s and Ray does not report %d of its %d "
                "actors dead yet; returning without them",
                self._actor_stop_timeout, len(alive), len(stopped),
            )
            return
        # Every actor that answered, whenever it did: one still starting when
        # shutdown began may already count as taken in the view read then.
        # (Counting one that did not only asks for more than the view can
        # show: the cluster's total caps that.)
        held = sum(1 for _, holds in stopped if holds)
        free_before = self._free_at_stop
        if (
            not held
            or free_before is None
            or isinstance(self._scheduling_strategy, PlacementGroupSchedulingStrategy)
        ):
            return
        reservation = {"CPU": self._num_cpus, **self._resources}
        try:
            total = ray.cluster_resources()
        except Exception:  # Ray going away: nothing left to wait for
            return
        # What was free before plus what the actors held, at most the cluster's
        # total (a node may have left since).
        target = {
            name: min(total.get(name, 0.0), free_before.get(name, 0.0) + amount * held)
            for name, amount in reservation.items()
            if amount > 0
        }
        while True:
            try:
                free = ray.available_resources()
            except Exception:  # Ray going away
                return
            short = {
                name: round(want - free.get(name, 0.0), 4)
                for name, want in target.items()
                if free.get(name, 0.0) < want - _RESOURCE_SLACK
            }
            if not short:
                return
            if time.monotonic() >= deadline:
                logger.warning(
                    "ray strategy: shutdown waited %g s and the cluster still counts %s of what its "
                    "%d actors held as taken (other work waiting for those resources may have "
                    "taken them); returning",
                    self._actor_stop_timeout, short, held,
                )
                return
            time.sleep(0.02)

    def after_fork_in_child(self) -> None:
        # The parent's slot threads do not exist here, its actors are its own
        # (and Ray's connection is not ours: `_connect` says so).
        stopping = self._stopping
        _parents_pools.append(dict(vars(self)))
        self._new_pool()
        if stopping:
            self.shutdown(wait=False, cancel_futures=True)

    # ---- one slot (`offload.strategy.SlotWorker`) --------------------------------------

    def new_slot(self, number: int) -> _Slot:
        return _Slot(number)

    def worker_ready(self, slot: _Slot) -> bool:
        return slot.actor is not None and not slot.killed

    def start_worker(self, slot: _Slot) -> None:
        if slot.actor is not None:
            self._retire(slot)
        _connect(self._address, self._ray_init_options)
        if self._actor_class is None:
            self._actor_class = ray.remote(RayWorker)
        options: dict[str, Any] = {"num_cpus": self._num_cpus, "max_restarts": 0}
        if self._resources:
            options["resources"] = self._resources
        if self._scheduling_strategy is not None:
            options["scheduling_strategy"] = self._scheduling_strategy
        actor = self._actor_class.options(**options).remote(self._initializer, self._initargs)
        with self._dispatch.lock:
            slot.actor, slot.killed = actor, self._terminating
        if slot.killed:
            _kill(actor)
        try:
            init_error = ray.get(actor.ready.remote(), timeout=self._actor_start_timeout)
        except ray.exceptions.GetTimeoutError:
            self._retire(slot)
            raise offload.OffloadError(
                f"ray strategy: no actor started within {self._actor_start_timeout:g} s; does any "
                f"node have num_cpus={self._num_cpus:g}"
                + (f" and resources {self._resources}" if self._resources else "")
                + " free?"
            ) from None
        except ray.exceptions.RayActorError as exc:
            self._retire(slot)
            raise offload.WorkerCrashed(f"ray actor died while starting: {exc}") from exc
        with self._dispatch.lock:
            slot.held = slot.actor is actor
        if init_error is not None:
            self._retire(slot)
            cause = _rebuild_error(init_error)
            raise initializer_failed(self._initializer, cause) from cause

    def stop_worker(self, slot: _Slot) -> None:
        self._retire(slot)

    def _retire(self, slot: _Slot) -> None:
        with self._dispatch.lock:
            actor, held = slot.actor, slot.held
            slot.actor, slot.held = None, False
            if actor is not None and self._stopping:
                self._stopped.append((actor, held))
        if actor is not None:
            _kill(actor)

    def run(self, slot: _Slot, call: Call[Any]) -> None:
        try:
            args, kwargs, stored = self._by_reference(call.args, call.kwargs)
            ref = slot.actor.run.remote(call.fn, *args, **kwargs)
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
            # news (a retry, `actors()`) still sees the dead actor as live.
            killed = slot.killed
            self._retire(slot)
            call.set_exception(
                offload.WorkerCrashed(f"ray actor died while running {_call_name(call)}(): {exc}")
            )
            self._replace(slot, "killed" if killed else "crashed")
            return
        except ray.exceptions.RayError as exc:
            # The reply could not be made or fetched (an unserializable result, a lost object).
            lost = offload.OffloadError(
                f"ray strategy: the result of {_call_name(call)}() could not be returned: {exc}"
            )
            lost.__cause__ = exc
            call.set_exception(lost)
            return
        finally:
            del ref, args, kwargs, stored
        if status == "ok":
            call.set_result(value)
        else:
            call.set_exception(_rebuild_error(value))

    def _replace(self, slot: _Slot, reason: str) -> None:
        """Start the dead actor's successor now, so the pool keeps its size (a
        failure here is retried by the next call)."""
        if self._stopping or self._terminating:
            return
        count_worker_restart(self, reason)
        try:
            self.start_worker(slot)
        except BaseException:  # noqa: S110 (the next call retries and reports it)
            pass

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


def _kill(actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: S110 (already gone, or Ray is shutting down)
        pass


#: Seconds shutdown gives Ray's GCS for the free resources before it kills
#: the actors, and past `actor_stop_timeout` for the wait after (a GCS that
#: answers does so in milliseconds).
_GCS_GRACE = 5.0


def _answer_within(question: Callable[[], _T], timeout: float) -> _T | None:
    """`question()`, or `None` if it raised or had not returned within
    `timeout` seconds. It runs on a daemon thread, which a call stuck in Ray's
    C++ core leaves behind: nothing can interrupt such a call."""
    answers: queue.SimpleQueue[_T | None] = queue.SimpleQueue()

    def ask() -> None:
        try:
            answers.put(question())
        except BaseException:  # Ray going away: no answer
            answers.put(None)

    threading.Thread(target=ask, name="offload-ray-ask-gcs", daemon=True).start()
    try:
        return answers.get(timeout=timeout)
    except queue.Empty:
        return None


def _dead_by(actor: Any, deadline: float) -> bool:
    """Whether Ray reports the killed `actor` dead before `deadline`. Ray
    answers a call to a dead actor with `RayActorError`; a kill still on its
    way may let a call through first."""
    while True:
        try:
            ray.get(actor.ready.remote(), timeout=max(0.0, deadline - time.monotonic()))
        except ray.exceptions.RayActorError:
            return True
        except ray.exceptions.GetTimeoutError:
            return False
        except Exception:  # Ray going away: nothing left to wait for
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
