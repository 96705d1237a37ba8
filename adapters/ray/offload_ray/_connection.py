"""This process's connection to Ray: made once, by one long-lived thread, and
what a fork does to it.

Ray binds the processes `ray.init` starts (a local GCS and raylet) to the
thread that started them (`prctl(PR_SET_PDEATHSIG)` fires when that *thread*
exits): started from a slot thread, they would die at the first shutdown and
take the program down with them. So every connection is made by one thread
that lives as long as the process.

Ray's connection does not survive `os.fork()`. A child has Ray's state but
not the connection; `connect` refuses there. A child must also never release
the Ray objects it inherited (actor handles, object refs): their finalizers
speak on the parent's connections, and with Ray 2.60 the parent's GCS then
stopped answering (`ray.available_resources()` never returned, no new actor
started) or Ray aborted it. So a child keeps the parent's pools
(`keep_parents_pool`) and freezes its garbage collector; and since a child's
own code can still release such objects, a parent that forked while
connected does not wait on its GCS at shutdown (`gcs_answers`).
"""

from __future__ import annotations

import gc
import os
import queue
import threading
from collections.abc import Callable, Mapping
from typing import Any

import ray

import offload

_requests: queue.SimpleQueue[tuple[Callable[[], None], queue.SimpleQueue[BaseException | None]]] = (
    queue.SimpleQueue()
)
_connector: threading.Thread | None = None
_connector_lock = threading.Lock()
#: True in a child forked from a process connected to Ray.
_inherited_connection = False
#: Ray jobs (connections) of this process that were connected when it forked.
_forked_jobs: set[str] = set()
#: In a child: the parent's pools (slots, actor handles, killed actors), kept
#: so that dropping them never releases the parent's actors through Ray.
_parents_pools: list[object] = []


def _serve_connections() -> None:
    while True:
        connect_now, reply = _requests.get()
        try:
            connect_now()
        except BaseException as exc:
            reply.put(exc)
        else:
            reply.put(None)


def connect(address: str | None, options: Mapping[str, Any]) -> None:
    """Connect this process to Ray (once), on the connector thread; raise
    `OffloadError` in a child of a connected process."""
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

    def connect_now() -> None:
        if not ray.is_initialized():
            ray.init(address=address, **options)

    reply: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
    _requests.put((connect_now, reply))
    error = reply.get()
    if error is not None:
        raise error


def gcs_answers() -> bool:
    """Whether shutdown may wait on Ray's GCS (actor deaths, free resources):
    connected, and not on a connection this process had when it forked."""
    return ray.is_initialized() and _current_job() not in _forked_jobs


def keep_parents_pool(pool: object) -> None:
    """In a forked child: keep `pool` (the parent's slots, actor handles and
    killed actors) alive for good, so that it never releases them through Ray."""
    _parents_pools.append(pool)


def _current_job() -> str | None:
    try:
        return str(ray.get_runtime_context().get_job_id()) if ray.is_initialized() else None
    except Exception:  # Ray going away: no job
        return None


def _after_fork_in_parent() -> None:
    job = _current_job()
    if job is not None:
        _forked_jobs.add(job)


def _after_fork_in_child() -> None:
    # The connector thread is the parent's; so is the connection.
    global _connector, _requests, _connector_lock, _inherited_connection
    _connector = None
    _requests = queue.SimpleQueue()
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
