"""Whether this process serves (and patches vLLM) or is one of the adapter's remote workers.

A remote worker (a `process` worker, a Ray actor) imports vLLM to build its
renderer, and vLLM may load its plugins there, calling `register` again. A
worker renders and post-processes what it is sent: it must not patch vLLM,
or the IO processors it builds would offload their work once more.
`register` checks `is_worker_process()` once; a worker's initializer calls
`mark_worker_process()` before any vLLM code runs in it.
"""

from __future__ import annotations

_worker = False


def mark_worker_process() -> None:
    """This process is a remote worker from now on."""
    global _worker
    _worker = True


def is_worker_process() -> bool:
    """True in a remote worker (after its initializer began)."""
    return _worker
