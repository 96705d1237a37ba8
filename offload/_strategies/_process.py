"""`process`: long-lived worker processes that survive crashes.

The path of a call:

    caller (event loop)          this process                       worker process
    ───────────────────          ────────────                       ──────────────
    Executor.run(fn, x)
      └─ ProcessStrategy.schedule
           └─ Dispatcher.put ──▶ CallQueue (fair: lane, flow, cost)
                                   │ a token wakes one slot thread
                                   ▼
                                 slot thread (_process_slot.ProcessSlotWorker.run)
                                   claims the call, pickles it (_encoding),
                                   big buffers into its shared-memory arena
                                   (_wire.Sender) ──── one frame, pipe ────▶ _child_main._serve
                                                                              runs fn(x), pickles the reply
                                   reads the reply (_wire.Receiver) ◀─ pipe ─┘
                                   call.set_result / set_exception
    waiter.wake ◀──────────────────┘
      └─ run returns

Layers: `_child_handle.WorkerProcess` is one child's lifecycle (spawn, wait
for its initializer, send, receive, kill, reap); `_process_slot.ProcessSlotWorker`
maps calls onto it (one slot thread per worker: crashes, kills, retirement,
replacement); this module is the strategy (options, start method, the pipe
that tells workers this process died, shutdown, exit, fork).
"""

from __future__ import annotations

import atexit
import itertools
import multiprocessing
import threading
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, final

from .._call import Call
from .._checks import check_positive_int, check_positive_number
from .._errors import ConfigError
from .._fork import forget_foreign_forkserver
from .._niceness import DEFAULT_NICE, check_nice
from .._pooled import PooledStrategy
from . import _wire
from ._child_handle import STOP_GRACE
from ._process_slot import ProcessSlot, ProcessSlotWorker, WorkerConfig

_pool_ids = itertools.count()

#: `forkserver` where the platform has it: a worker is forked from a small,
#: single-threaded server process (never from the parent, whose threads and
#: torch/OpenMP state make `fork` unsafe), and starts a worker faster than
#: `spawn`, which re-imports everything in every new worker.
DEFAULT_START_METHOD = (
    "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
)
_START_METHODS = ("forkserver", "spawn")

#: How long a worker may take from its start to the end of its initializer
#: before it is killed and the call waiting for it fails. vLLM gives its
#: engine the same 600 s to come up (`VLLM_ENGINE_READY_TIMEOUT_S`): a cold
#: worker that imports a tokenizer (6 s on an idle 2-core machine) took over
#: 120 s on a shared machine slowed ~20x, so the bound is for stuck workers,
#: not slow ones.
DEFAULT_WORKER_START_TIMEOUT = 600.0
_CANCEL_MODES = ("finish", "kill")


_live: weakref.WeakSet[ProcessStrategy] = weakref.WeakSet()


@atexit.register
def _shutdown_all() -> None:
    # Registered after multiprocessing's own exit hook, so it runs first: the
    # workers are gone before multiprocessing joins them. Running calls are
    # cut short, as a `thread` call is (its daemon thread just stops): one
    # stuck call must not hold up interpreter exit.
    for strategy in list(_live):
        strategy._terminate()


@final
class ProcessStrategy(PooledStrategy[ProcessSlot]):
    """Runs calls in up to `max_workers` long-lived worker processes: for
    pure-Python work that holds the GIL (chat templates, image processors,
    building large JSON), which the event loop's process then never runs.
    Each rule is on the method it governs: what crosses to a worker and
    what a crash does on `schedule`, cancellation on `cancel_running`, the
    workers' lifetime on `start` and `shutdown`, the options on `__init__`."""

    name = "process"
    carries_context = False
    #: A worker that dies mid-call fails that call (`WorkerCrashed`) and is replaced.
    replaces_crashed_workers = True

    def __init__(
        self,
        max_workers: int | None = None,
        *,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
        max_tasks_per_worker: int | None = None,
        max_worker_memory: int | None = None,
        shared_memory_threshold: int | None = _wire.DEFAULT_SHM_THRESHOLD,
        cancel: str = "finish",
        start_method: str | None = None,
        nice: int = DEFAULT_NICE,
        worker_start_timeout: float | None = DEFAULT_WORKER_START_TIMEOUT,
        express_cost: float = 0.0,
    ) -> None:
        """The pool's options; nothing starts until the first call.

        **Priority.** Workers run at `nice` (default 10) above this process's
        niceness, so the event loop wins the CPU when both want it.

        Args:
            max_workers: at most this many worker processes (and concurrent calls).
                `None`: `OFFLOAD_MAX_WORKERS`, else the number of usable CPUs (more
                processes than cores only add switching).
            initializer: run once in each worker process, before its first call;
                its return value is that process's `worker_state()`. Must be
                picklable. If it raises, the call that started the worker fails
                with `OffloadError` (the cause attached).
            initargs: positional arguments for `initializer` (picklable).
            max_tasks_per_worker: replace a worker after this many calls. `None`
                (default): never; set it to contain a slow leak.
            max_worker_memory: replace a worker after a call that left its resident
                memory (RSS) above this many bytes. `None` (default): no ceiling.
            shared_memory_threshold: buffers of at least this many bytes go through
                shared memory. Default 256 KiB (measured: below it the pipe is
                as fast); `None` turns shared memory off.
            cancel: `"finish"` (default, the rule of every strategy) or `"kill"`.
            start_method: `"forkserver"` (default where available) or `"spawn"`;
                `"fork"` is refused (unsafe once the parent runs threads or torch).
            nice: added to the workers' niceness (0 to 19; default 10, see
                `DEFAULT_NICE`); 0 runs them at this process's priority.
            worker_start_timeout: seconds a worker process may take to start and
                run its initializer (default 600, see
                `DEFAULT_WORKER_START_TIMEOUT`); past that it is killed and the
                call that started it (or `start()`) fails with `OffloadError`.
                `None`: no limit.
            express_cost: above 0, one more worker process, the *express* worker,
                runs calls priced at most this (in the callers' cost unit) and at
                most a quarter of the costliest call running on the other workers
                (`offload.strategy.Dispatcher`), in the queue's fair order, at
                this process's priority (no `nice`): a cheap call does not wait
                for a worker busy with a far longer call. 0 (default): none.
                `max_workers` and `capacity()` do not count it.
        """
        for option, value in (
            ("max_tasks_per_worker", max_tasks_per_worker),
            ("max_worker_memory", max_worker_memory),
            ("shared_memory_threshold", shared_memory_threshold),
        ):
            if value is not None:
                check_positive_int(value, option, or_none=True)
        if worker_start_timeout is not None:
            worker_start_timeout = check_positive_number(
                worker_start_timeout, "worker_start_timeout", or_none=True
            )
        if cancel not in _CANCEL_MODES:
            raise ConfigError(f"cancel must be one of {_CANCEL_MODES}, got {cancel!r}")
        start_method = DEFAULT_START_METHOD if start_method is None else start_method
        if start_method not in _START_METHODS:
            raise ConfigError(
                f"start_method must be one of {_START_METHODS} (fork is unsafe with threads), "
                f"got {start_method!r}"
            )
        check_nice(nice)
        self._kill_on_cancel = cancel == "kill"
        self._start_method = start_method
        self._pool = f"offload-process-{next(_pool_ids)}"
        self._config = WorkerConfig(
            name=self._pool,
            initializer=initializer,
            initargs=initargs,
            threshold=shared_memory_threshold,
            max_tasks=max_tasks_per_worker,
            max_memory=max_worker_memory,
            nice=nice,
            start_timeout=worker_start_timeout,
        )
        self._prepare_lock = threading.Lock()
        # Made on first use: nothing (no pipe, no server process) exists until a call.
        self._alive_r: Connection | None = None
        self._alive_w: Connection | None = None
        super().__init__(max_workers, initializer=initializer, initargs=initargs, express_cost=express_cost)

    def thread_name_prefix(self) -> str:
        return self._pool

    def new_slot_worker(self) -> ProcessSlotWorker:
        # A pool's worth of state (its pipe to the workers, whether it is
        # stopping): a fresh one for each dispatcher, and a fresh start.
        self._slots = ProcessSlotWorker(self, self._config)
        self._prepared = False
        return self._slots

    def worker_pids(self) -> list[int]:
        """Pids of the live worker processes (for tests and diagnostics)."""
        workers = [slot.worker for slot in self._dispatch.slots()]
        return [w.pid for w in workers if w is not None and w.pid is not None and w.alive()]

    # ---- calls -------------------------------------------------------------------

    def _prepare(self) -> None:
        if self._prepared:
            return
        with self._prepare_lock:
            if self._prepared or self._dispatch.stopping:
                return
            ctx = multiprocessing.get_context(self._start_method)
            if self._start_method == "forkserver":
                # A server inherited through a fork (this process never ran
                # `os.register_at_fork` hooks, say) is not ours to use.
                forget_foreign_forkserver()
                # Workers fork with the worker module already imported.
                ctx.set_forkserver_preload(["offload._strategies._child_main"])
            # Workers read the one end; this process alone holds the other, so its
            # death is an end of file in every worker.
            self._alive_r, self._alive_w = ctx.Pipe(duplex=False)
            self._slots.prepare(ctx, self._alive_r)
            self._prepared = True
            _live.add(self)

    def schedule(self, call: Call[Any]) -> None:
        """Queue `call` for a worker process.

        **What crosses the boundary.** The function (by reference: module-level
        functions and classes) and its arguments are pickled to the worker, the
        result or exception pickled back. Something that cannot be pickled fails
        the call with `TypeError` naming it. `contextvars` do not cross: the
        function runs in the worker's own context. An exception reaches the caller
        with the same type and message and the function's own frames in its
        traceback (rebuilt with tblib).

        **Large payloads.** Buffers of `shared_memory_threshold` bytes or more
        (NumPy arrays, `bytearray`, CPU torch tensors, and `bytes` passed or
        returned directly) travel through shared memory instead of the pipe, both
        ways; received arrays are views of it (no copy).

        **Crashes.** If a worker dies while running a call (a signal, a segfault,
        `os._exit`), that call raises `WorkerCrashed` naming the exit code or
        signal; other calls are unaffected, and a fresh process takes its place.

        **Failures of this process.** If shared memory cannot be set up for a
        call's arguments here (no file descriptor left, say), that call fails
        with `OffloadError` naming the cause and the worker is left alone; if
        `/dev/shm` is full, the buffers go through the pipe instead. A reply that
        cannot be rebuilt here fails only its own call.
        """
        self._prepare()
        super().schedule(call)

    def start(self) -> None:
        """**Lifetime.** Workers start on the first calls (not at construction) and
        stay. `shutdown()` stops them; they also exit on their own if this
        process dies. At interpreter exit, queued calls are dropped and running
        ones are cut short (their workers killed), so a stuck call cannot hold up
        exit. In a child made by `os.fork()` the pool starts empty: the child's
        calls run in fresh workers of its own.
        """
        self._prepare()
        super().start()

    def cancel_running(self, call: Call[Any], reason: str) -> None:
        """**Cancellation.** As for every strategy, a call that has not started never
        starts, and by default (`cancel="finish"`) a running call finishes in its
        worker with its result dropped. With `cancel="kill"`, the worker running a
        cancelled call (or one whose deadline passed) is killed at once and
        replaced: use it for long calls whose results are worthless once nobody
        waits, and whose side effects may be cut short. Such kills, and those of
        `aclose(timeout=)` (which also stops workers still starting), are counted
        as stopped calls, not crashes.
        """
        if not self._kill_on_cancel:
            return
        dispatch = self._dispatch
        with dispatch.lock:  # the slot cannot move on to another call meanwhile
            slot = dispatch.slot_running(call)
            if slot is not None:
                self._slots.kill_running(slot, call, reason)

    def terminate_running(self) -> bool:
        self._slots.terminate(self._dispatch.running(), self._dispatch.slots())
        return True

    # ---- shutdown, exit, fork ------------------------------------------------------

    def shutdown(self, wait: bool, cancel_futures: bool) -> None:
        self._slots.stopping = True
        super().shutdown(wait, cancel_futures)
        if wait:
            with self._prepare_lock:
                if not self._dispatch.slots():
                    for conn in (self._alive_w, self._alive_r):
                        if conn is not None:
                            conn.close()
                    self._alive_w = self._alive_r = None
                _live.discard(self)

    def _terminate(self) -> None:
        """Interpreter exit: drop queued calls, kill every worker; return
        within a bounded time."""
        self._slots.stopping = True
        self._dispatch.close(cancel_futures=True)
        for _ in range(2):  # a worker started just now is killed on the second pass
            self._slots.terminate(self._dispatch.running(), self._dispatch.slots())
            if self._dispatch.join(STOP_GRACE):
                return

    def after_fork_in_child(self) -> None:
        # The worker processes are the parent's: close this child's copies of
        # their pipes (the parent's death must still reach them as end of
        # file), and keep multiprocessing from joining them at this child's exit.
        for slot in self._dispatch.slots():
            worker = slot.worker
            if worker is not None:
                worker.conn.close()
                multiprocessing.process._children.discard(worker.process)  # type: ignore[attr-defined]
        for conn in (self._alive_r, self._alive_w):
            if conn is not None:
                conn.close()
        self._alive_r = self._alive_w = None
        self._prepare_lock = threading.Lock()
        super().after_fork_in_child()
        _live.discard(self)

