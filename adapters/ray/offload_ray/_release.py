"""Killing a pool's actors, and what `shutdown(wait=True)` waits for: the
actors it killed dead, and the cluster counting what they reserved as free
again.

`ray.available_resources()` reads the GCS's view of each node, which the
node's raylet overwrites with its own count a moment after that changes
(Ray's syncer). A kill shows there only once the raylet has freed the
actor's reservation and reported it, and nothing in Ray says when that has
happened. So shutdown reads the view before it kills anything, and waits
until it shows that much free again plus what the killed actors held, at
most the cluster's total. An actor holds its reservation from the moment
its node grants it, before its constructor runs; the pool learns it only
when the actor answers. So every killed actor that had answered counts,
whenever it answered: one still starting when shutdown began may already
be counted as taken in the view read then (counting it when it was not
only asks for more than the view can show; the cluster's total caps that).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, final

import ray
import ray.exceptions

from ._connection import gcs_answers

#: Seconds shutdown gives Ray's GCS for the free resources before it kills
#: the actors, and past `actor_stop_timeout` for the wait after (a GCS that
#: answers does so in milliseconds).
GCS_GRACE = 5.0

#: Resource amounts closer than this are equal: Ray counts resources in
#: units of 1/10000.
_RESOURCE_SLACK = 0.5e-4

_T = TypeVar("_T")

logger = logging.getLogger("offload_ray")


def kill_actor(actor: Any) -> None:
    """Kill `actor` for good (no restart); nothing if it is gone already."""
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: S110 (already gone, or Ray is shutting down)
        pass


@final
class Release:
    """One pool's shutdown: the actors it kills, and the wait for what they held.

    `begin()` when shutdown begins, `kill()` for each actor, `wait()` to wait
    for them. Thread-safe.
    """

    def __init__(self, reservation: Mapping[str, float], timeout: float, *, to_cluster: bool) -> None:
        """`reservation`: what one actor reserves. `timeout`: `actor_stop_timeout`.
        `to_cluster`: false for actors in a placement group, which give their
        resources back to the group: for those `wait` waits for their death only."""
        self._reservation = {name: amount for name, amount in reservation.items() if amount > 0}
        self._timeout = timeout
        self._to_cluster = to_cluster
        self._lock = threading.Lock()
        self._begin_lock = threading.Lock()
        self._began = False
        #: What the cluster counted free when shutdown began (`None`: not
        #: read: no actor then, Ray going away, or its GCS not answering).
        self._free_before: dict[str, float] | None = None
        #: Actors killed since shutdown began, each with whether it held its
        #: reservation, until `wait` has waited for them.
        self._killed: list[tuple[Any, bool]] = []

    def begin(self, *, has_actors: bool) -> None:
        """Shutdown begins, before it kills any actor: read what the cluster
        counts free (once; not without actors, nor where its GCS may not be asked)."""
        with self._begin_lock:
            if self._began:
                return
            free = None
            if has_actors and gcs_answers():
                free = answer_within(ray.available_resources, min(GCS_GRACE, self._timeout))
            with self._lock:
                self._free_before, self._began = free, True

    def kill(self, actor: Any, *, held: bool) -> None:
        """Kill `actor`; once shutdown began, `wait` waits for it. `held`: it
        answered, so its node had granted its reservation."""
        with self._lock:
            if self._began:
                self._killed.append((actor, held))
        kill_actor(actor)

    def wait(self) -> None:
        """Return once the actors killed since `begin` (and not waited for yet)
        are dead and the cluster counts what they held as free again, or after
        the timeout with a warning. Does not wait in a process that forked while
        connected. Ray's calls here go through its GCS and have no timeout of
        their own: they run on a daemon thread, so that one the GCS never answers
        cannot hold shutdown beyond the timeout plus `GCS_GRACE`."""
        with self._lock:
            killed, self._killed = self._killed, []
        if not killed or not gcs_answers():
            return
        deadline = time.monotonic() + self._timeout

        def wait() -> bool:
            self._wait_for(killed, deadline)
            return True

        if answer_within(wait, self._timeout + GCS_GRACE) is None:
            logger.warning(
                "ray strategy: shutdown waited %g s and Ray's GCS did not answer whether its "
                "%d actors are dead and their resources free; returning",
                self._timeout, len(killed),
            )

    def _wait_for(self, killed: list[tuple[Any, bool]], deadline: float) -> None:
        alive = [actor for actor, _ in killed if not _dead_by(actor, deadline)]
        if alive:
            logger.warning(
                "ray strategy: shutdown waited %g s and Ray does not report %d of its %d "
                "actors dead yet; returning without them",
                self._timeout, len(alive), len(killed),
            )
            return
        held = sum(1 for _, holds in killed if holds)
        free_before = self._free_before
        if not held or free_before is None or not self._to_cluster:
            return
        try:
            total = ray.cluster_resources()
        except Exception:  # Ray going away: nothing left to wait for
            return
        # What was free before plus what the actors held, at most the cluster's
        # total (a node may have left since).
        target = {
            name: min(total.get(name, 0.0), free_before.get(name, 0.0) + amount * held)
            for name, amount in self._reservation.items()
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
                    self._timeout, short, held,
                )
                return
            time.sleep(0.02)


def answer_within(question: Callable[[], _T], timeout: float) -> _T | None:
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
    # Looked up outside the `try`: a wrong name is a bug to surface, not Ray going away.
    where = actor.where
    while True:
        try:
            ray.get(where.remote(), timeout=max(0.0, deadline - time.monotonic()))
        except ray.exceptions.RayActorError:
            return True
        except ray.exceptions.GetTimeoutError:
            return False
        except Exception:  # Ray going away: nothing left to wait for
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
