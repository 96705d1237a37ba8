"""What `PoolingOfflineMixin._executor` becomes: offline batches rendered under the strategy, never refused.

`LLM.embed()/score()/classify()/encode()` render a batch with
`self._executor.map(io_processor.render, prompts)`. `concurrent.futures`'
`map` submits every prompt at once: with `OFFLOAD_VLLM_MAX_QUEUE` set, a batch
larger than the workers plus the queue would fail with `Overloaded`, and
the calls already submitted would run for nothing. Here `map` feeds the
executor within its capacity instead: a window of `CALLS_PER_WORKER` calls
per worker in flight, the next submitted as each result is taken, all inside
one admission made with `refuse=False` (an offline batch is never refused;
its calls are one flow of the default lane, each costing its prompt's
characters).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import contextvars
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ._placements import Placement
from ._seams.io_processor import is_io_processor
from ._seams.requests import render_params_cost

#: Calls in flight per worker: one running, one waiting, so that no worker
#: idles while vLLM takes the previous result.
CALLS_PER_WORKER = 2

#: The `function` label of offline batches' admissions (never refused).
OFFLINE_LABEL = "vllm.offline_batch"


class OfflineRenderExecutor(concurrent.futures.Executor):
    """`map(io_processor.render, ...)` renders with the placement's render call,
    within the executor's capacity; anything else runs as submitted."""

    def __init__(self, placement: Placement) -> None:
        self._placement = placement
        self._executor = placement.executor

    def _route(self, fn: Callable[..., Any]) -> tuple[Callable[..., Any], tuple[Any, ...], bool]:
        """`(fn, lead, renders)`: what to run for `fn`, and whether it renders prompts."""
        owner = getattr(fn, "__self__", None)
        if getattr(fn, "__name__", None) == "render" and is_io_processor(owner):
            return (*self._placement.render_call(owner), True)
        return fn, (), False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        target, lead, _ = self._route(fn)
        with self._executor.admission(OFFLINE_LABEL, cost=0.0, refuse=False):
            return self._executor.submit(target, *lead, *args, **kwargs)

    def map(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
        buffersize: int | None = None,
    ) -> Iterator[Any]:
        """Results in order, as `concurrent.futures.Executor.map`; calls are
        submitted as results are taken, at most `CALLS_PER_WORKER` per worker
        ahead (`timeout`, `chunksize` and `buffersize` are not used)."""
        target, lead, renders = self._route(fn)
        window = CALLS_PER_WORKER * (self._executor.capacity or 1)
        return self._feed(target, lead, renders, zip(*iterables, strict=False), window)

    def _feed(
        self,
        fn: Callable[..., Any],
        lead: tuple[Any, ...],
        renders: bool,
        items: Iterator[tuple[Any, ...]],
        window: int,
    ) -> Iterator[Any]:
        # The admission lives in a context of its own, entered and left by this
        # generator: vLLM takes results between other work, on its own context.
        context = contextvars.copy_context()
        held = contextlib.ExitStack()
        context.run(held.enter_context, self._executor.admission(OFFLINE_LABEL, cost=0.0, refuse=False))
        pending: collections.deque[concurrent.futures.Future[Any]] = collections.deque()

        def submit_next() -> bool:
            """Submit the next item's call; False when there is none left."""
            args = next(items, None)
            if args is None:
                return False
            options = self._executor.options(cost=render_params_cost(args[0]) if renders else 1.0)
            pending.append(context.run(options.submit, fn, *lead, *args))
            return True

        try:
            while len(pending) < window and submit_next():
                pass
            while pending:
                result = pending.popleft().result()
                submit_next()
                yield result
        finally:
            for future in pending:
                future.cancel()
            context.run(held.close)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._executor.shutdown(wait=wait, cancel_futures=cancel_futures)

