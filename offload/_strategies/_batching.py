"""`async-renderer`: one worker thread that runs queued calls as micro-batches.

`async-renderer` is the registry name of `BatchingStrategy` (after vLLM's
async renderer, whose micro-batching it keeps; docs/strategies/async-renderer.md).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from functools import partial
from typing import Any, TypeVar, final

from typing_extensions import ParamSpec

from .._call import Call
from .._checks import check_initializer, check_non_negative_number, check_positive_int
from .._errors import ConfigError, OffloadError, executor_closed
from .._queue import CallQueue
from .._slot_interface import ThreadSlotWorker
from .._startup import Startup
from .._strategy import Strategy
from .._worker_lifecycle import serve
from ._batch_form import BatchedFunction, batch_key, run_batch

T = TypeVar("T")
P = ParamSpec("P")

#: One fast-tokenizer call on 64 texts is where the batching benchmark (benchmarks/suites/batching.py) measured its ~1.5x gain over
#: 64 single calls; larger batches mostly add to the slowest caller's latency, since
#: every caller in a batch waits for the whole batch.
DEFAULT_MAX_BATCH_SIZE = 64

#: No batching window: an idle worker starts a call at once. A window is what cost
#: vLLM's micro-batcher ~2 ms a request at low load (its 2 ms `batch_wait_timeout`).
DEFAULT_MAX_WAIT = 0.0

_worker_ids = itertools.count()
logger = logging.getLogger(__name__)


@final
class BatchingStrategy(Strategy):
    """Micro-batching: one worker thread drains a queue, running pending calls of a
    function that has a batch form as one `batch([...], **kwargs)` call."""

    name = "async-renderer"

    def __init__(
        self,
        *,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        max_wait: float = DEFAULT_MAX_WAIT,
        in_flight: Callable[[], int] | None = None,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
        thread_name_prefix: str = "offload-batch",
    ) -> None:
        """The worker's options; its thread starts with the first call.

        Args:
            max_batch_size: at most this many calls per batch (default 64, see
                `DEFAULT_MAX_BATCH_SIZE`). 1 disables batching.
            max_wait: seconds a batch that is not full waits for more calls,
                counted from when its oldest call was queued. Default 0: never
                wait. A positive value trades latency for bigger batches, and then
                applies even to a call on an idle worker (vLLM's async renderer
                behaved like `max_wait=0.002`), unless `in_flight` is given.
            in_flight: how many calls are in flight or on their way, the batch's
                own included; e.g. a server's requests being served, each making
                one call. With it, a batch that is not full waits for more calls
                (up to `max_wait`) only while this is more than the batch's size:
                a lone call starts at once, and the window is spent only under
                load, when other work is in the server. It is read on the worker
                thread, with the strategy's lock held, when a batch starts to
                wait and each time a call joins it (not polled: a batch whose
                others finish without joining waits out `max_wait`): it must be
                cheap, thread-safe and never block (read a counter). If it
                raises, batches stop waiting; the error is logged once.
            initializer: run once in the worker thread; its return value is that
                thread's `worker_state()`, e.g. the worker's own tokenizer. If it
                raises, the next queued call fails with `OffloadError` (the
                cause attached), and the one after it tries the initializer
                again; so every queued call ends, shutdown or not.
            initargs: positional arguments for `initializer`.
            thread_name_prefix: names the worker thread `{prefix}-{n}`.

        With `max_queue` on the executor, calls that may wait beyond one full
        batch before new ones fail with `Overloaded`.
        """
        check_positive_int(max_batch_size, "max_batch_size")
        max_wait = check_non_negative_number(max_wait, "max_wait")
        if in_flight is not None and not callable(in_flight):
            raise ConfigError(f"in_flight must be a callable returning a count, got {in_flight!r}")
        check_initializer(initializer, initargs)
        self._max_batch_size = max_batch_size
        self._max_wait = max_wait
        self._in_flight = in_flight
        self._in_flight_failed = False
        self._initializer = initializer
        self._initargs = initargs
        self._name = f"{thread_name_prefix}-{next(_worker_ids)}"
        self._reset()
        self._stopping = False

    def _reset(self) -> None:
        self._pending = CallQueue()
        # Each queued call's batch key, computed once, by its caller.
        self._keys: dict[Call[Any], Hashable | None] = {}
        # A batch the worker holds back while `max_wait` lets it fill (shutdown may drop it).
        self._collecting: list[Call[Any]] = []
        self._cond = threading.Condition(threading.Lock())
        self._threads: set[threading.Thread] = set()

    def capacity(self) -> int:
        """A full batch. One worker, so at most one call (or one batch) runs at
        a time; a call that waits joins the next batch. Pair it with a
        tokenizer, whose Rust core parallelises a batch across cores by itself."""
        return self._max_batch_size

    def after_fork_in_child(self) -> None:
        # The parent's worker does not exist here; its queued calls are its own.
        self._reset()

    @property
    def max_batch_size(self) -> int:
        return self._max_batch_size

    @property
    def max_wait(self) -> float:
        return self._max_wait

    def batch_form(self, fn: Callable[P, T], batch: Callable[..., list[Any]]) -> Callable[P, T]:
        """`fn` with its batch form `batch`, for `make_async(fn, batch=batch)`.

        **Batch form.** `make_async(fn, batch=batch_fn)` with `fn` taking exactly one
        positional argument (the item). The strategy calls
        `batch_fn([item1, item2, ...], **kwargs)`, which must return a list (or
        tuple) of results in the same order, each equal to what `fn(item_i,
        **kwargs)` would return. It runs in the worker with `worker_state()` set,
        inside the `contextvars` context of the batch's oldest call. A batch of one
        calls `fn` itself. Calls made without a batch form, or with other than one
        positional argument, run one at a time in the queue's order, on the one
        worker, like vLLM's single-worker multimodal executor.

        **Errors.** If `batch_fn` raises, each call of that batch is run again on its
        own with `fn`, so only the bad item fails, with its own exception; the
        others get their results. A batch result that is not a list or tuple of the
        right length is a bug in the batch form: every caller of that batch gets
        `OffloadError` saying so.
        """
        return BatchedFunction(fn, batch)

    # ---- caller side ---------------------------------------------------------

    def schedule(self, call: Call[Any]) -> None:
        """Queue `call` for the worker, which batches it with others that may join it.

        **Order.** The worker takes the next call as every queue does (fairly by
        lane, flow and cost; see `Executor`), then the queued calls that may join
        its batch, one by one in the same fair order (`CallQueue.take`): lanes
        share a batch by weight, and each lane and flow is charged for the calls
        it got, as if they had run one by one.

        **No idle cost.** A call that arrives while the worker is idle starts at
        once, alone, as with `thread`: there is no batching window by default.
        Calls that arrive while the worker is busy wait in the queue; when the
        worker is free it takes the oldest one and, if it has a batch form, every
        other queued call with the same function and equal keyword arguments (up to
        `max_batch_size`, in the queue's order: oldest first, for calls of one
        lane and equal costs) and runs them as one batch. So batches form
        only under load, exactly when they pay. Calls with different keyword
        arguments never share a batch: plain values (numbers, strings, bytes,
        `None`, tuples of them) must be equal and of the same types, anything else
        (an array, a tensor) the very same object.

        **Cancellation.** A cancelled call that is still queued is taken out of its
        batch and never runs; the others in the batch are not affected. Once a
        batch has started, cancelling one caller drops only that caller's result.
        """
        key = batch_key(call)
        with self._cond:
            if self._stopping:
                raise executor_closed(self.name)
            if not self._threads:
                # Before queuing: a thread that cannot start fails this call only.
                try:
                    self._spawn()
                except RuntimeError as exc:  # can't start new thread
                    raise OffloadError(f"{self.name}: could not start its worker thread: {exc}") from exc
            self._pending.push(call)
            self._keys[call] = key
            self._cond.notify()

    def _spawn(self, startup: Startup | None = None) -> None:
        # Called with the lock held. Registered only once it runs: a thread
        # that could not start must not stand for a worker that does not exist.
        thread = threading.Thread(target=self._work, args=(startup,), name=self._name, daemon=True)
        thread.start()
        self._threads.add(thread)

    def start(self) -> None:
        startup = Startup()
        with self._cond:
            if self._stopping:
                raise executor_closed(self.name)
            if not self._threads:
                self._spawn(startup)
                startup.expect(1)
        startup.wait()

    # ---- worker side ---------------------------------------------------------

    def _work(self, startup: Startup | None = None) -> None:
        # The one worker thread is a slot whose thread is its worker, as `thread`'s are.
        worker = ThreadSlotWorker(self._initializer, self._initargs)
        slot = worker.new_slot(0)
        try:
            serve(
                self._heads(),
                start=partial(worker.start_worker, slot),
                ready=partial(worker.worker_ready, slot),
                run=lambda head: run_batch(self._batch(*head), slot.state),
                fail=_fail,
                startup=startup,
            )
        finally:
            with self._cond:
                self._threads.discard(threading.current_thread())

    def _heads(self) -> Iterator[tuple[Call[Any], Hashable | None]]:
        """The worker's one wait for work: each next queued call, with its
        batch key, until shut down with none left."""
        while True:
            with self._cond:
                while True:
                    head = self._pending.pop()
                    if head is not None:
                        break
                    if self._stopping:
                        return
                    self._cond.wait()  # no timeout: an idle worker waits only for a call
                key = self._keys.pop(head, None)
                self._forget_withdrawn()
            yield head, key
            del head  # don't keep the last call's arguments alive while idle

    def _batch(self, head: Call[Any], key: Hashable | None) -> list[Call[Any]]:
        """`head` and the queued calls that may join its batch."""
        group = [head]
        if key is None or self._max_batch_size == 1:
            return group
        with self._cond:
            self._gather(key, group)
            if self._max_wait > 0:
                deadline = head.queued_at + self._max_wait
                self._collecting = group
                while len(group) < self._max_batch_size and not self._stopping:
                    remaining = deadline - time.perf_counter()
                    if remaining <= 0:
                        break
                    # Read when the batch starts waiting and as each call joins,
                    # not polled: every poll would wake the worker to contend
                    # for the GIL with the loop that makes the calls.
                    if self._in_flight is not None and not self._others_in_flight(len(group)):
                        break
                    self._cond.wait(remaining)
                    self._gather(key, group)
                self._collecting = []
        return group

    def _others_in_flight(self, batched: int) -> bool:
        """Whether `in_flight` counts calls beyond the `batched` ones (False once it failed)."""
        assert self._in_flight is not None
        if self._in_flight_failed:
            return False
        try:
            return self._in_flight() > batched
        except Exception:
            # A broken count must not stop the worker: batches stop waiting.
            self._in_flight_failed = True
            logger.exception("%s: in_flight() raised; batches no longer wait for calls in flight", self.name)
            return False

    def _forget_withdrawn(self) -> None:
        # The queue drops withdrawn calls as it reaches them; their keys go
        # when they outnumber the queued calls (with the lock held).
        if len(self._keys) > 2 * len(self._pending) + 64:
            queued = set(self._pending)
            self._keys = {call: key for call, key in self._keys.items() if call in queued}

    def _gather(self, key: Hashable, group: list[Call[Any]]) -> None:
        """Move queued calls with `key` into `group`, in the queue's fair order
        (each charged to its lane and flow), up to the size limit. Called with
        the lock held."""
        keys = self._keys
        taken = self._pending.take(
            lambda call: call in keys and keys[call] == key, self._max_batch_size - len(group)
        )
        for call in taken:
            del keys[call]
        group.extend(taken)

    # ---- shutdown ------------------------------------------------------------

    def shutdown(self, wait: bool, cancel_futures: bool) -> None:
        dropped: list[Call[Any]] = []
        with self._cond:
            if cancel_futures:
                dropped = self._pending.drain() + self._collecting
                self._keys.clear()
            self._stopping = True
            self._cond.notify_all()
            threads = list(self._threads)
        # Outside the lock: a dropped call's callbacks (a future's done-callbacks)
        # may call back into this executor, `shutdown()` included.
        for call in dropped:
            call.drop()
        if wait:
            me = threading.current_thread()
            for thread in threads:
                if thread is not me:
                    thread.join()


def _fail(head: tuple[Call[Any], Hashable | None], error: BaseException) -> None:
    call = head[0]
    if call.claim():
        call.set_exception(error)
