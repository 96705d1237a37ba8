"""`async-renderer`: one worker lane that runs queued calls as micro-batches."""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar, final

from typing_extensions import ParamSpec

from .._call import PENDING, Call
from .._config import check_initializer
from .._errors import ConfigError, ExecutorClosed, OffloadError
from .._executor import Executor
from .._metrics import count_batch
from .._startup import Startup
from .._worker_state import _NO_STATE, _swap_state
from ._fork import forget_in_child

T = TypeVar("T")
P = ParamSpec("P")

#: One fast-tokenizer call on 64 texts is where issue 4 measured its ~1.5x gain over
#: 64 single calls; larger batches mostly add to the slowest caller's latency, since
#: every caller in a batch waits for the whole batch.
DEFAULT_MAX_BATCH_SIZE = 64

#: No batching window: an idle worker starts a call at once. A window is what cost
#: vLLM's micro-batcher ~2 ms a request at low load (its 2 ms `batch_wait_timeout`).
DEFAULT_MAX_WAIT = 0.0

_lane_ids = itertools.count()


@final
class BatchedFunction(Generic[P, T]):
    """A function together with its batch form, as `make_async(fn, batch=...)` builds it
    for the micro-batching strategy.

    Calling it calls `fn` (so it behaves as `fn` anywhere else); the strategy
    recognises it and may run several pending calls as one `batch(...)` call.
    It pickles when `fn` and `batch` do.
    """

    __slots__ = ("batch", "fn")

    def __init__(self, fn: Callable[P, T], batch: Callable[..., list[Any]]) -> None:
        self.fn = fn
        self.batch = batch

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.fn(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (BatchedFunction, (self.fn, self.batch))

    def __repr__(self) -> str:
        return f"<BatchedFunction fn={self.fn!r} batch={self.batch!r}>"


@final
class _Same:
    """Stands for a value in a batch key that is equal only to itself: comparing
    it never runs the value's own `==` (a NumPy array's or a tensor's raises,
    or answers with an array)."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(other) is _Same and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)


_PLAIN = (type(None), bool, int, str, bytes)


def _exact(value: object) -> Hashable:
    """A key for `value` that equals another's only when the batch form may take
    either for the other: same types all the way down, and no user `==`."""
    kind = type(value)
    if kind in _PLAIN:
        return (kind, value)
    if kind is float:
        return (float, value.hex())  # type: ignore[attr-defined]  # -0.0 is not 0.0; nan is nan
    if kind is tuple:
        return (tuple, tuple(_exact(item) for item in value))  # type: ignore[attr-defined]
    return _Same(value)


def _batch_key(call: Call[Any]) -> Hashable | None:
    """What a call must share with others to join their batch, or None if it runs alone.

    Only a `BatchedFunction` called with exactly one positional argument can be
    batched, and only with calls of the same function and batch form and the
    same keyword arguments: `None`, `bool`, `int`, `float`, `str`, `bytes` and
    tuples of them by type and value, all the way down (`(True,)` never joins
    `(1,)`), anything else (an array, a tensor, a list) only if it is the very
    same object. No value's own `==` is ever called, so no key can fail.
    """
    fn = call.fn
    if type(fn) is not BatchedFunction or len(call.args) != 1:
        return None
    try:
        # Keyword names are unique, so sorting never compares the values.
        kwargs = tuple((name, _exact(value)) for name, value in sorted(call.kwargs.items()))
    except RecursionError:  # absurdly deep tuples: run alone
        return None
    return (_Same(fn.fn), _Same(fn.batch), kwargs)


@final
class BatchingExecutor(Executor):
    """Micro-batching: one worker thread drains a queue, running pending calls of a
    function that has a batch form as one `batch([...], **kwargs)` call.

    **No idle cost.** A call that arrives while the worker is idle starts at
    once, alone, as with `thread`: there is no batching window by default.
    Calls that arrive while the worker is busy wait in the queue; when the
    worker is free it takes the oldest one and, if it has a batch form, every
    other queued call with the same function and equal keyword arguments (up to
    `max_batch_size`, oldest first) and runs them as one batch. So batches form
    only under load, exactly when they pay. Calls with different keyword
    arguments never share a batch: plain values (numbers, strings, bytes,
    `None`, tuples of them) must be equal and of the same types, anything else
    (an array, a tensor) the very same object.

    **Batch form.** `make_async(fn, batch=batch_fn)` with `fn` taking exactly one
    positional argument (the item). The strategy calls
    `batch_fn([item1, item2, ...], **kwargs)`, which must return a list (or
    tuple) of results in the same order, each equal to what `fn(item_i,
    **kwargs)` would return. It runs in the worker with `worker_state()` set,
    inside the `contextvars` context of the batch's oldest call. A batch of one
    calls `fn` itself. Calls made without a batch form, or with other than one
    positional argument, run one at a time in arrival order: a single ordered
    lane, like vLLM's single-worker multimodal executor.

    **Errors.** If `batch_fn` raises, each call of that batch is run again on its
    own with `fn`, so only the bad item fails, with its own exception; the
    others get their results. A batch result that is not a list or tuple of the
    right length is a bug in the batch form: every caller of that batch gets
    `OffloadError` saying so.

    **Cancellation.** A cancelled call that is still queued is taken out of its
    batch and never runs; the others in the batch are not affected. Once a
    batch has started, cancelling one caller drops only that caller's result.

    **Concurrency bound.** One worker, so at most one call (or one batch) runs at
    a time. Pair it with a tokenizer, whose Rust core parallelises a batch
    across cores by itself.

    Args:
        max_batch_size: at most this many calls per batch (default 64, see
            `DEFAULT_MAX_BATCH_SIZE`). 1 disables batching.
        max_wait: seconds a batch that is not full waits for more calls,
            counted from when its oldest call was queued. Default 0: never
            wait. A positive value trades latency for bigger batches, and then
            applies even to a call on an idle worker (vLLM's async renderer
            behaved like `max_wait=0.002`).
        initializer: run once in the worker thread; its return value is that
            thread's `worker_state()`, e.g. the worker's own tokenizer. If it
            raises, the oldest queued call fails with `OffloadError` (the
            cause attached) and a fresh worker takes the rest; once shutdown
            has begun, every queued call fails that way instead.
        initargs: positional arguments for `initializer`.
        thread_name_prefix: names the worker `{prefix}-{lane}`.
        max_queue: calls that may wait beyond one full batch before new ones
            fail with `Overloaded`. `None` (default): unbounded.
    """

    name = "async-renderer"

    def __init__(
        self,
        *,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        max_wait: float = DEFAULT_MAX_WAIT,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
        thread_name_prefix: str = "offload-batch",
        max_queue: int | None = None,
    ) -> None:
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be a positive integer, got {max_batch_size!r}")
        if (
            isinstance(max_wait, bool)
            or not isinstance(max_wait, (int, float))
            or not 0 <= max_wait < float("inf")
        ):
            raise ConfigError(f"max_wait must be a finite number of seconds >= 0, got {max_wait!r}")
        check_initializer(initializer, initargs)
        self._max_batch_size = max_batch_size
        self._max_wait = float(max_wait)
        self._initializer = initializer
        self._initargs = initargs
        self._name = f"{thread_name_prefix}-{next(_lane_ids)}"
        # (batch key, call) in arrival order; the key is computed once, by the caller.
        self._pending: deque[tuple[Hashable | None, Call[Any]]] = deque()
        # A batch the worker holds back while `max_wait` lets it fill (shutdown may drop it).
        self._collecting: list[Call[Any]] = []
        self._cond = threading.Condition(threading.Lock())
        self._threads: set[threading.Thread] = set()
        self._stopping = False
        forget_in_child(self)
        self._set_max_queue(max_queue)

    def _capacity(self) -> int:
        # One batch runs at a time; a call that waits joins the next one.
        return self._max_batch_size

    def _after_fork_in_child(self) -> None:
        # The parent's worker does not exist here; its queued calls are its own.
        super()._after_fork_in_child()
        self._pending = deque()
        self._collecting = []
        self._cond = threading.Condition(threading.Lock())
        self._threads = set()

    @property
    def max_batch_size(self) -> int:
        return self._max_batch_size

    @property
    def max_wait(self) -> float:
        return self._max_wait

    def _with_batch_form(
        self, fn: Callable[P, T], batch: Callable[..., list[Any]]
    ) -> Callable[P, T]:
        return BatchedFunction(fn, batch)

    # ---- caller side ---------------------------------------------------------

    def _schedule(self, call: Call[Any]) -> None:
        key = _batch_key(call)
        with self._cond:
            if self._stopping:
                raise ExecutorClosed("BatchingExecutor is shut down")
            self._pending.append((key, call))
            if not self._threads:
                self._spawn()
            self._cond.notify()

    def _spawn(self, startup: Startup | None = None) -> None:
        # Called with the lock held.
        thread = threading.Thread(target=self._work, args=(startup,), name=self._name, daemon=True)
        self._threads.add(thread)
        thread.start()

    def start(self) -> None:
        super().start()
        startup = Startup()
        with self._cond:
            if self._stopping:
                raise ExecutorClosed("BatchingExecutor is shut down")
            if not self._threads:
                self._spawn(startup)
                startup.expect(1)
        startup.wait()

    # ---- worker side ---------------------------------------------------------

    def _work(self, startup: Startup | None = None) -> None:
        state: Any = _NO_STATE
        if self._initializer is not None:
            try:
                state = self._initializer(*self._initargs)
            except BaseException as exc:
                if startup is not None:
                    error = OffloadError(f"worker initializer {self._initializer!r} failed: {exc!r}")
                    error.__cause__ = exc
                    startup.finished(error)
                self._fail_start(exc)
                return
        if startup is not None:
            startup.finished()
        try:
            while True:
                batch = self._next_batch()
                if batch is None:
                    break
                self._run(batch, state)
                del batch  # don't keep the last batch's arguments alive while idle
        finally:
            with self._cond:
                self._threads.discard(threading.current_thread())

    def _next_batch(self) -> list[Call[Any]] | None:
        """Wait for work; take the oldest pending call and the calls that may join it."""
        with self._cond:
            while True:
                while not self._pending:
                    if self._stopping:
                        return None
                    self._cond.wait()  # no timeout: an idle worker waits only for a call
                key, head = self._pending.popleft()
                if head.state is PENDING:
                    break
            group = [head]
            if key is None or self._max_batch_size == 1:
                return group
            self._gather(key, group)
            if self._max_wait > 0:
                deadline = head.queued_at + self._max_wait
                self._collecting = group
                while len(group) < self._max_batch_size and not self._stopping:
                    remaining = deadline - time.perf_counter()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                    self._gather(key, group)
                self._collecting = []
            return group

    def _gather(self, key: Hashable, group: list[Call[Any]]) -> None:
        """Move queued calls with `key` into `group`, oldest first, up to the size limit.
        Also forgets cancelled calls on the way. Called with the lock held."""
        room = self._max_batch_size - len(group)
        if room <= 0:
            return
        rest: deque[tuple[Hashable | None, Call[Any]]] = deque()
        for entry in self._pending:
            call = entry[1]
            if call.state is not PENDING:
                continue
            if room and entry[0] == key:
                group.append(call)
                room -= 1
            else:
                rest.append(entry)
        self._pending = rest

    def _run(self, group: list[Call[Any]], state: Any) -> None:
        # Claiming here, right before the start, is what keeps a call cancelled
        # while it sat in the batch from running.
        claimed = [call for call in group if call.claim()]
        count_batch(claimed)
        if len(claimed) == 1:
            claimed[0].execute(state)
        elif claimed:
            self._run_batch(claimed, state)

    def _run_batch(self, claimed: list[Call[Any]], state: Any) -> None:
        first = claimed[0]
        form: BatchedFunction[..., Any] = first.fn  # type: ignore[assignment]
        items = [call.args[0] for call in claimed]
        previous = _swap_state(state)
        try:
            if first.context is None:
                results = form.batch(items, **first.kwargs)
            else:
                results = first.context.run(form.batch, items, **first.kwargs)
        except Exception:
            failed = True
        except BaseException as exc:  # KeyboardInterrupt, SystemExit: not an item's fault
            for call in claimed:
                call.set_exception(exc)
            return
        else:
            failed = False
        finally:
            _swap_state(previous)
            del items
        if failed:
            # Find the bad item(s): each call alone, with its own exception and frames.
            for call in claimed:
                call.execute(state)
            return
        if not isinstance(results, (list, tuple)) or len(results) != len(claimed):
            shape = f"{type(results).__name__}" + (
                f" of {len(results)}" if isinstance(results, (list, tuple)) else ""
            )
            for call in claimed:
                call.set_exception(
                    OffloadError(
                        f"batch form {form.batch!r} returned a {shape} for {len(claimed)} "
                        "items; it must return a list with one result per item, in order"
                    )
                )
            return
        for call, result in zip(claimed, results, strict=True):
            call.set_result(result)

    def _fail_start(self, exc: BaseException) -> None:
        """The initializer raised: fail the oldest call and let a fresh worker
        take the rest, or, once shutdown has begun (nobody would start that
        worker), fail them all: no call may be left pending."""
        with self._cond:
            self._threads.discard(threading.current_thread())
            victims: list[Call[Any]] = []
            while self._pending and (self._stopping or not victims):
                _, call = self._pending.popleft()
                if call.state is PENDING:
                    victims.append(call)
            if self._pending and not self._stopping:
                self._spawn()
        for victim in victims:
            if victim.claim():
                error = OffloadError(f"worker initializer {self._initializer!r} failed: {exc!r}")
                error.__cause__ = exc
                victim.set_exception(error)

    # ---- shutdown ------------------------------------------------------------

    def _shutdown(self, wait: bool, cancel_futures: bool) -> None:
        dropped: list[Call[Any]] = []
        with self._cond:
            if cancel_futures:
                dropped = [call for _, call in self._pending]
                dropped += self._collecting
                self._pending.clear()
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
