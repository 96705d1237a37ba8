"""`ray`: long-lived actors of a Ray cluster, fed from offload's queue on the caller's side.

Built on offload's public strategy interface only (`offload.strategy`): the
queue, the slot threads, start-up, shutdown and fork are `PooledStrategy`'s;
this module is what one slot does with its actor (the package's `__init__`
maps the rest).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, final

import ray
import ray.exceptions
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

import offload
from offload.strategy import (
    SHUTDOWN,
    Call,
    PooledStrategy,
    check_non_negative_number,
    check_positive_int,
    check_positive_number,
    initializer_failed,
    replace_worker,
)

from ._actor import RayWorker
from ._arguments import DEFAULT_OBJECT_STORE_THRESHOLD, through_object_store
from ._connection import connect, keep_parents_pool
from ._release import GCS_GRACE, Release, answer_within, kill_actor

#: How long an actor may take to be placed (its process up), and then again to
#: run its initializer. Long enough for a cold worker process that imports a
#: tokenizer on a busy node; an actor that asks for resources no node has would
#: otherwise wait forever.
DEFAULT_ACTOR_START_TIMEOUT = 120.0

#: How long `shutdown(wait=True)` waits for the actors it killed to be dead and
#: for the cluster to count their resources as free again. Ray frees them within
#: a fraction of a second; a node that stopped answering takes Ray up to its
#: health-check period (about 30 s) to declare dead.
DEFAULT_ACTOR_STOP_TIMEOUT = 60.0


def _free_cpus() -> str:
    """`" (the cluster has 0 of 4 CPUs free)"`, or `""` where Ray cannot say."""
    # For the message only; Ray's GCS calls have no timeout of their own.
    view = answer_within(lambda: (ray.available_resources(), ray.cluster_resources()), GCS_GRACE)
    if view is None:
        return ""
    free, total = view[0].get("CPU", 0.0), view[1].get("CPU", 0.0)
    return f" (the cluster has {free:g} of {total:g} CPUs free)"


def _call_name(call: Call[Any]) -> str:
    return getattr(call.fn, "__qualname__", None) or repr(call.fn)


@final
class _Slot:
    """One slot's actor. `actor`, `killed` and `held` change under the dispatcher's lock."""

    __slots__ = ("actor", "held", "killed", "number")

    def __init__(self, number: int) -> None:
        self.number = number
        self.actor: Any = None
        #: offload killed (or is killing) its actor on purpose.
        self.killed = False
        #: `actor` answered (it was placed): its constructor ran, so its node
        #: had granted its reservation.
        self.held = False


@final
class RayStrategy(PooledStrategy[_Slot]):
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
    (`offload.strategy.portable_error`, checked with cloudpickle: a class
    defined in the caller's `__main__` included). `contextvars` do not cross.

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
            `"ray://host:port"` (Ray Client), an IP and port, `"local"` (always
            a new local instance) or `None`: Ray's choice (a cluster named by
            `RAY_ADDRESS`, else the cluster started last on this host with
            `ray start`, else a new local one).
        num_cpus: CPUs each actor reserves (fractions allowed). Default 1.
        resources: custom resources each actor reserves, e.g. `{"preprocess": 1}`.
        scheduling_strategy: where actors go: `"DEFAULT"`, `"SPREAD"` (one per
            node in turn), or a Ray scheduling strategy object
            (`NodeAffinitySchedulingStrategy`, `PlacementGroupSchedulingStrategy`).
        object_store_threshold: arguments of at least this many bytes go
            through the object store; `None` leaves it to Ray.
        actor_start_timeout: seconds an actor may take to be placed (its
            process up), and then as many again to run its initializer, before
            the call waiting for it fails with `OffloadError`, which says which
            of the two it waited for (no node had the resources asked for, or
            the initializer is slow).
        actor_stop_timeout: seconds `shutdown(wait=True)` waits for the actors
            it killed to be dead and their resources free (see Lifetime).
        ray_init_options: extra keyword arguments for `ray.init` when this
            executor starts the connection (`num_cpus`, `object_store_memory`, ...;
            not `address`: `ConfigError`).
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
        if address is not None and not (isinstance(address, str) and address.strip()):
            raise offload.ConfigError(
                f"address must be 'auto', 'ray://host:port', 'host:port' or None, got {address!r}"
            )
        self._num_cpus = check_non_negative_number(num_cpus, "num_cpus")
        if resources is not None:
            if not isinstance(resources, Mapping):
                raise offload.ConfigError(f"resources must be a mapping of name to amount, got {resources!r}")
            for key, amount in resources.items():
                if not isinstance(key, str):
                    raise offload.ConfigError(f"resource names must be strings, got {key!r}")
                check_non_negative_number(amount, f"resources[{key!r}]")
        if object_store_threshold is not None:
            check_positive_int(object_store_threshold, "object_store_threshold", or_none=True)
        self._actor_start_timeout = check_positive_number(actor_start_timeout, "actor_start_timeout")
        self._actor_stop_timeout = check_positive_number(actor_stop_timeout, "actor_stop_timeout")
        if ray_init_options is not None and not isinstance(ray_init_options, Mapping):
            raise offload.ConfigError(f"ray_init_options must be a mapping, got {ray_init_options!r}")
        if ray_init_options is not None and "address" in ray_init_options:
            # `ray.init(address=address, **ray_init_options)` would fail late, at the first call.
            raise offload.ConfigError("ray_init_options must not hold 'address': pass address=... to the strategy")
        self._address = address
        self._resources = dict(resources or {})
        self._scheduling_strategy = scheduling_strategy
        self._threshold = object_store_threshold
        self._ray_init_options = dict(ray_init_options or {})
        self._actor_class: Any = None
        super().__init__(max_workers, initializer=initializer, initargs=initargs)

    def new_slot_worker(self) -> RayStrategy:
        # The strategy drives its actors itself; a fresh pool (at
        # construction, and in a child after a fork) starts with fresh
        # shutdown bookkeeping.
        self._terminating = False
        self._release = Release(
            {"CPU": self._num_cpus, **self._resources},
            self._actor_stop_timeout,
            to_cluster=not isinstance(self._scheduling_strategy, PlacementGroupSchedulingStrategy),
        )
        return self

    def actors(self) -> list[Any]:
        """The live actor handles (for tests and diagnostics)."""
        return [slot.actor for slot in self.dispatcher.slots() if slot.actor is not None]

    # ---- the strategy ----------------------------------------------------------------

    def schedule(self, call: Call[Any]) -> None:
        super().schedule(call)
        # Every actor at once: connecting to Ray and placing actors is slow,
        # and a pool that grew call by call would pay it under load.
        self.dispatcher.grow()

    def terminate_running(self) -> bool:
        # Ray cannot interrupt a synchronous actor task: kill the actors still
        # running one, or still starting. Their callers get `WorkerCrashed`; no
        # successor starts (the pool is stopping), so every slot exits promptly.
        # Set first: an actor that a slot is starting now is killed by the slot.
        self._terminating = True
        for _, call in self.dispatcher.running():
            call.stop(SHUTDOWN)
        for slot in self.dispatcher.slots():
            with self.dispatcher.lock:
                actor = slot.actor
                slot.killed = slot.killed or actor is not None
            if actor is not None:
                kill_actor(actor)
        return True

    def shutdown(self, wait: bool, cancel_futures: bool) -> None:
        # Before any actor is killed: what they hold is not free yet. An actor
        # still starting counts: it may hold its reservation already.
        slots = self.dispatcher.slots()
        with self.dispatcher.lock:
            has_actors = any(slot.actor is not None for slot in slots)
        self._release.begin(has_actors=has_actors)
        super().shutdown(wait, cancel_futures)
        if wait:
            self._release.wait()

    def after_fork_in_child(self) -> None:
        # The parent's actors are its own (and Ray's connection is not ours:
        # `connect` says so); their objects must outlive this child's pool.
        keep_parents_pool(dict(vars(self)))
        super().after_fork_in_child()

    # ---- one slot (`offload.strategy.SlotWorker`) --------------------------------------

    def new_slot(self, number: int) -> _Slot:
        return _Slot(number)

    def worker_ready(self, slot: _Slot) -> bool:
        return slot.actor is not None and not slot.killed

    def start_worker(self, slot: _Slot) -> None:
        if slot.actor is not None:
            self._retire(slot)
        connect(self._address, self._ray_init_options)
        if self._actor_class is None:
            self._actor_class = ray.remote(RayWorker)
        options: dict[str, Any] = {"num_cpus": self._num_cpus, "max_restarts": 0}
        if self._resources:
            options["resources"] = self._resources
        if self._scheduling_strategy is not None:
            options["scheduling_strategy"] = self._scheduling_strategy
        actor = self._actor_class.options(**options).remote(self.initializer, self.initargs)
        with self.dispatcher.lock:
            slot.actor, slot.killed = actor, self._terminating
        if slot.killed:
            kill_actor(actor)
        timeout = self._actor_start_timeout
        try:
            node, pid = ray.get(actor.where.remote(), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            self._retire(slot)
            raise offload.OffloadError(
                f"ray strategy: no actor started within {timeout:g} s: none was placed"
                f"{_free_cpus()}; does any node have num_cpus={self._num_cpus:g}"
                + (f" and resources {self._resources}" if self._resources else "")
                + " free?"
            ) from None
        except ray.exceptions.RayActorError as exc:
            self._retire(slot)
            raise offload.WorkerCrashed(f"ray actor died while starting: {exc}") from exc
        with self.dispatcher.lock:
            slot.held = slot.actor is actor
        try:
            init_error = ray.get(actor.initialize.remote(), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            self._retire(slot)
            raise offload.OffloadError(
                f"ray strategy: an actor was placed (pid {pid} on node {node[:8]}), but its "
                f"initializer {getattr(self.initializer, '__qualname__', self.initializer)!r} had not "
                f"returned within {timeout:g} s more; a slow initializer needs a larger actor_start_timeout"
            ) from None
        except ray.exceptions.RayActorError as exc:
            self._retire(slot)
            raise offload.WorkerCrashed(f"ray actor died while running its initializer: {exc}") from exc
        if init_error is not None:
            self._retire(slot)
            raise initializer_failed(self.initializer, init_error) from init_error

    def stop_worker(self, slot: _Slot) -> None:
        self._retire(slot)

    def _retire(self, slot: _Slot) -> None:
        with self.dispatcher.lock:
            actor, held = slot.actor, slot.held
            slot.actor, slot.held = None, False
        if actor is not None:
            self._release.kill(actor, held=held)

    def run(self, slot: _Slot, call: Call[Any]) -> None:
        try:
            args, kwargs, stored = through_object_store(call.args, call.kwargs, self._threshold)
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
            call.set_exception(value)

    def _replace(self, slot: _Slot, reason: str) -> None:
        """Start the dead actor's successor now, so the pool keeps its size (a
        failure here is retried by the next call)."""
        if not (self.dispatcher.stopping or self._terminating):
            replace_worker(self, self, slot, reason)
