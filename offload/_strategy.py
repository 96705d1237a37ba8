"""`Strategy`: the interface a strategy implements (public as `offload.strategy.Strategy`)."""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from typing_extensions import ParamSpec

from ._call import Call

T = TypeVar("T")
P = ParamSpec("P")


class Strategy(abc.ABC):
    """How an `offload.Executor` runs calls: a strategy owns workers, the
    executor owns everything else.

    **Audience.** Strategy authors. Users never call these methods: they
    build an executor (`offload.get_executor(name)`, `offload.Executor(strategy)`)
    and use `run`, `submit` and the rest. The executor calls a strategy only
    as described here; everything cross-cutting happens around it, once, for
    every strategy: the closed state (`schedule` is never called after
    `shutdown` began, except in a race the strategy must close: see
    `schedule`), admission (`max_queue`, cost bounds, `Overloaded`),
    deadlines, cancellation of queued calls, lanes and flows (on `Call`),
    metrics, fork registration and the error messages users see.

    **Required.** `name` (a class attribute: the registry name, equal to the
    entry-point name of a plugin; it labels metrics), `schedule` and
    `shutdown`.

    **Optional**, each with a default that does nothing: `start`, `capacity`,
    `cancel_running`, `terminate_running`, `batch_form`, `after_fork_in_child`,
    and the class attributes `carries_context`, `replaces_crashed_workers`
    and `crash_fails_running_calls`.

    **Options.** Users pass options by keyword (`get_executor(name, **options)`,
    `make_async(strategy=name, **options)`); each goes to the strategy's
    constructor as a keyword argument of the same name, except the
    executor's own (`max_queue`, `max_queued_cost`, `lanes`, `scheduling`),
    which a strategy may not take. An option the constructor does not take is
    a `ConfigError` naming the valid ones. A constructor with a
    `max_workers` parameter opts in to `OFFLOAD_MAX_WORKERS`: when the user
    gives none (or `None`), the variable's value is passed. Check values in
    the constructor and raise `ConfigError` (`check_max_workers`,
    `check_initializer`).

    **Helpers**: `offload.strategy` (the fair queue, the slot dispatcher, the
    argument checks, what workers in other processes need).

    **Checking one.** `offload.testing.StrategyContract` is the contract
    suite, for pytest: subclass it in a test module and set `strategy_name`.

    """

    #: The registry name; a plugin's equals its entry-point name.
    name: ClassVar[str]

    #: Whether `fn` runs in a copy of the caller's `contextvars` context. A
    #: strategy that runs calls in another process cannot carry it: False.
    carries_context: ClassVar[bool] = True

    #: Whether a worker that dies running a call (its process killed) fails
    #: only that call, with `WorkerCrashed`, and is replaced, so that the next
    #: call runs on a fresh worker. True for strategies whose workers are
    #: processes or actors (`process`, `ray`); the contract suite
    #: (`offload.testing`) kills a worker to check it.
    replaces_crashed_workers: ClassVar[bool] = False

    #: With `replaces_crashed_workers`: whether a worker's crash fails the
    #: other calls running in the pool too, with `WorkerCrashed` (one pool
    #: behind every slot that breaks whole, as a
    #: `concurrent.futures.ProcessPoolExecutor` does; it may let a call that
    #: was about to end still end). The next call runs, on fresh workers.
    #: False: the calls running beside it finish. The contract suite kills a
    #: worker beside a running call to check the one declared.
    crash_fails_running_calls: ClassVar[bool] = False

    # ---- required ------------------------------------------------------------

    @abc.abstractmethod
    def schedule(self, call: Call[Any]) -> None:
        """Arrange for `call` to run; do not wait for it.

        Must not block (`inline`, which runs the call right here, is the one
        exception). Must raise `ExecutorClosed` if `shutdown` has begun, and be
        race-free against it: a call accepted here is one `shutdown` will see
        (it runs it, or drops it with `call.drop()`). Any other exception
        fails this call only, with that exception. A queuing strategy keeps
        calls in a `CallQueue`, whose order honours `call.cost`, `call.lane`
        and `call.flow`. May be called from any thread, concurrently with
        itself and with `shutdown`.

        **Workers and calls.** A worker (a thread, a process, an actor) must
        `call.claim()` a call right before running it and skip it if that returns
        `False` (its caller went away, its deadline passed, shutdown dropped it);
        then `call.execute(state)` runs it in the caller's context with `state` as
        `offload.worker_state()`, or, for a worker in another process, the result
        comes back through `call.set_result(value)` / `call.set_exception(error)`.
        Every scheduled call must end exactly once: run, withdrawn, or failed.
        """

    @abc.abstractmethod
    def shutdown(self, wait: bool, cancel_futures: bool) -> None:
        """Stop accepting calls; drop the queued ones (`call.drop()`) if
        `cancel_futures`, else let them run; with `wait`, return once every
        worker has exited. Called again on repeated shutdowns (with
        `cancel_futures=True` by `aclose(timeout=)` first, then with `wait`):
        must be idempotent."""

    # ---- optional ------------------------------------------------------------

    def start(self) -> None:
        """Start and warm every worker now; return once each has run its
        initializer. Raise the error a first call would get if one cannot
        start (the executor passes it on): the workers that did start stay up,
        and the one that failed is tried again by the next call that needs it,
        never failing that call with this error. Default: nothing to start.

        Every worker means every worker calls run on: with one pool shared by
        every slot (a `concurrent.futures` executor), the pool's, as many as
        `capacity()` (calls that run at once), so that no call afterwards
        starts one. A pool that starts workers only when none is idle
        (`ThreadPoolExecutor`) starts that many only for as many calls held at
        once: `offload.strategy.run_on_each_worker` does it."""
        return

    def capacity(self) -> int | None:
        """How many calls run at once (the workers, or one batch's size);
        `None` if calls never wait (no queue: `max_queue` does not apply)."""
        return None

    def cancel_running(self, call: Call[Any], reason: str) -> None:
        """The caller of `call`, which is running, is gone (`reason`:
        `"cancelled"` or `"deadline"`). Default: let it finish, its result
        dropped. A strategy that can stop it (kill its worker) calls
        `call.stop(reason)` first, so that it is not counted as a crash."""
        return

    def terminate_running(self) -> bool:
        """`aclose(timeout=)` ran out of time: stop the calls still running,
        where possible (calling `call.stop("shutdown")` on each), and return
        True if the workers will now exit promptly. Default: False (threads
        cannot be stopped; their calls finish in the background)."""
        return False

    def batch_form(self, fn: Callable[P, T], batch: Callable[..., list[Any]]) -> Callable[P, T]:
        """What to schedule for `fn` when `make_async(fn, batch=batch)` uses
        this strategy. Default: `fn` (calls run one by one)."""
        return fn

    def after_fork_in_child(self) -> None:
        """In a child made by `os.fork()`: forget the parent's workers and
        queued calls (they are the parent's), so that the child's calls start
        workers of its own. Called once per fork, in the child only, before
        any other thread runs there. Default: nothing (no workers)."""
        return

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
