"""Hypothesis: random interleavings of calls (`run` and `submit`, small and
large payloads, failing and slow ones, of random costs in random lanes, alone
or in flows of several calls), cancellations, worker kills, shared-memory maps
that fail (a worker left without address space for a while) and shutdowns,
against every strategy on every backend.

Each example checks that every call ends exactly once, with its own result,
its own exception, `WorkerCrashed` (only after a worker was killed or
starved), `ExecutorClosed` (only after a shutdown), a failed transfer (only
after a worker was starved, and never a lost arena file) a worker that
could not start (only while no thread could start: a window in which every new
thread's stack is larger than the address space) or cancellation (only when
it was cancelled); that nothing hangs, and that the executor serves again
once threads can start; and that no thread, file
descriptor, process or `/dev/shm` file is left behind once the executor is
shut down.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import threading
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import offload
from offload._strategies import _wire

from . import helpers
from .conftest import BACKENDS, small_options

psutil = pytest.importorskip("psutil")

pytestmark = pytest.mark.slow

#: Bounds a hang; an example normally takes well under a second.
HANG_LIMIT = 60
#: Above the shared-memory threshold, so large payloads cross through the arenas.
LARGE = _wire.DEFAULT_SHM_THRESHOLD + 4096

LANES = {"query": 3.0, "ingest": 1.0}
#: A thread stack no address space holds: while it is set, no thread can start.
NO_THREAD_STACK = 1 << 47

delays = st.sampled_from([0.0, 0.0, 0.002, 0.02])
placement = st.tuples(
    st.sampled_from([None, "query", "ingest"]), st.sampled_from([0.0, 1.0, 1.0, 7.0, 400.0])
)
call = st.tuples(
    st.sampled_from(["run", "submit"]), st.booleans(), delays, st.sampled_from([0, 0, 64, LARGE]), placement
)
actions = st.lists(
    st.one_of(
        call.map(lambda c: ("call", *c)),
        st.tuples(st.just("flow"), st.lists(call, min_size=2, max_size=4), placement),
        st.tuples(st.just("cancel"), st.integers(0, 63)),
        st.tuples(st.just("kill"), st.integers(0, 7)),
        st.tuples(st.just("starve"), st.sampled_from([0.02, 0.1])),
        st.tuples(st.just("threads"), st.booleans()),
        st.tuples(st.just("pause"), st.sampled_from([0.0, 0.005, 0.02])),
        st.tuples(st.just("shutdown"), st.booleans()),
    ),
    min_size=1,
    max_size=24,
)


@dataclass
class Record:
    tag: int
    kind: str
    fail: bool
    delay: float
    size: int
    lane: str | None = None
    cost: float = 1.0
    cancelled: bool = False
    outcomes: list[tuple[Any, ...]] = field(default_factory=list)
    scope: anyio.CancelScope | None = None
    future: concurrent.futures.Future[Any] | None = None

    def expected(self) -> Any:
        return helpers.tag_bytes(self.tag, self.size) if self.size else ("result", self.tag)

    def target(self) -> tuple[Any, ...]:
        if self.size:
            payload = helpers.tag_bytes(self.tag, self.size)
            return (helpers.tagged_payload, self.tag, self.fail, self.delay, payload)
        return (helpers.tagged, self.tag, self.fail, self.delay)


@dataclass
class Scenario:
    strategy: str
    records: list[Record] = field(default_factory=list)
    killed: bool = False
    starved: bool = False
    #: A window in which no thread could start was opened.
    threadless: bool = False
    shut: bool = False
    cancel_futures: bool = False
    worker_pids: set[int] = field(default_factory=set)


async def _one_run(ex: offload.Executor, record: Record) -> None:
    assert record.scope is not None
    with record.scope:
        try:
            value = await ex.options(cost=record.cost, lane=record.lane).run(*record.target())
        except anyio.get_cancelled_exc_class():
            record.outcomes.append(("cancelled",))
            raise
        except BaseException as exc:
            record.outcomes.append(("error", exc))
        else:
            record.outcomes.append(("ok", value))
    if record.scope.cancelled_caught and not record.outcomes:
        record.outcomes.append(("cancelled",))  # cancelled before it began


def _settle(record: Record, future: concurrent.futures.Future[Any]) -> None:
    if future.cancelled():
        record.outcomes.append(("cancelled",))
    elif future.exception() is not None:
        record.outcomes.append(("error", future.exception()))
    else:
        record.outcomes.append(("ok", future.result()))


async def _drive(ex: offload.Executor, scenario: Scenario, steps: list[tuple[Any, ...]]) -> None:
    records = scenario.records
    with anyio.fail_after(HANG_LIMIT):
        async with anyio.create_task_group() as tg:
            for step in steps:
                if isinstance(ex, offload.Executor) and scenario.strategy == "process":
                    scenario.worker_pids.update(ex.strategy.worker_pids())  # type: ignore[attr-defined]
                if step[0] == "call":
                    _start(ex, tg, records, step[1:])
                    await anyio.lowlevel.checkpoint()
                elif step[0] == "flow":
                    # Several calls of one unit of work: one admission, one flow.
                    (lane, cost) = step[2]
                    with ex.admission("interleavings", cost=cost, lane=lane):
                        for one in step[1]:
                            _start(ex, tg, records, one)
                    await anyio.lowlevel.checkpoint()
                elif step[0] == "starve" and scenario.strategy == "process":
                    scenario.starved = True
                    try:
                        ex.submit(helpers.starve_address_space, step[1])
                    except offload.OffloadError:  # closed, or no thread could start
                        pass
                elif step[0] == "cancel" and records:
                    record = records[step[1] % len(records)]
                    record.cancelled = True
                    if record.scope is not None:
                        record.scope.cancel()
                    elif record.future is not None:
                        record.future.cancel()
                elif step[0] == "kill" and scenario.strategy == "process":
                    pids = sorted(ex.strategy.worker_pids())  # type: ignore[attr-defined]
                    if pids:
                        scenario.killed = True
                        try:
                            os.kill(pids[step[1] % len(pids)], signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                elif step[0] == "threads":
                    # Real: pthread_create fails (a stack larger than the
                    # address space), for every thread this process starts.
                    if step[1]:
                        threading.stack_size(0)
                    else:
                        scenario.threadless = True
                        threading.stack_size(NO_THREAD_STACK)
                elif step[0] == "pause":
                    await anyio.sleep(step[1])
                elif step[0] == "shutdown":
                    scenario.shut = True
                    scenario.cancel_futures |= step[1]
                    ex.shutdown(wait=False, cancel_futures=step[1])


def _start(ex: offload.Executor, tg: Any, records: list[Record], spec: tuple[Any, ...]) -> None:
    kind, fail, delay, size, (lane, cost) = spec
    record = Record(len(records), kind, fail, delay, size, lane, cost)
    records.append(record)
    if kind == "run":
        record.scope = anyio.CancelScope()
        tg.start_soon(_one_run, ex, record)
        return
    try:
        record.future = ex.options(cost=cost, lane=lane).submit(*record.target())
    except offload.OffloadError as exc:  # closed, or no worker could start: told at once
        record.outcomes.append(("error", exc))
    else:
        record.future.add_done_callback(lambda f, record=record: _settle(record, f))


def _starved_transfer(error: BaseException) -> bool:
    """A failure a starved worker may cause: a buffer it could not map or copy."""
    text = f"{error!r} {error.__cause__!r}"
    if "FileNotFoundError" in text or "No such file" in text:
        return False  # an arena file lost for good: the defect, never allowed
    return isinstance(error, (MemoryError, TypeError, OSError, offload.OffloadError))


def _no_thread(error: BaseException) -> bool:
    """A failure a window without threads may cause: a worker that could not start."""
    return isinstance(error, offload.OffloadError) and "could not start" in str(error)


def _check(scenario: Scenario) -> None:
    for record in scenario.records:
        assert len(record.outcomes) == 1, f"call {record.tag} ended {len(record.outcomes)} times"
        (outcome,) = record.outcomes
        if outcome[0] == "ok":
            assert not record.fail
            assert outcome[1] == record.expected(), f"call {record.tag} got another call's result"
        elif outcome[0] == "cancelled":
            assert record.cancelled or (record.kind == "submit" and scenario.cancel_futures)
        else:
            error = outcome[1]
            if isinstance(error, helpers.TaggedError):
                assert record.fail
                assert error.tag == record.tag, f"call {record.tag} got call {error.tag}'s exception"
            elif isinstance(error, offload.WorkerCrashed):
                assert scenario.killed or scenario.starved, f"call {record.tag}: {error!r} with no worker killed"
            elif isinstance(error, offload.ExecutorClosed):
                assert scenario.shut, f"call {record.tag}: {error!r} with no shutdown"
            elif (scenario.starved and _starved_transfer(error)) or (scenario.threadless and _no_thread(error)):
                pass
            else:
                raise AssertionError(f"call {record.tag} ended with {error!r}") from error


def _fds() -> set[str]:
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.add(f"{fd}:{os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:  # noqa: PERF203 (one per fd, by design)
            pass  # the directory's own fd, closed by now
    return fds


def _offload_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("offload")}


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _shm_files(pids: set[int]) -> list[str]:
    if not os.path.isdir(_wire.SHM_DIR):
        return []
    prefixes = tuple(_wire.shm_prefix(pid) for pid in pids)
    return [name for name in os.listdir(_wire.SHM_DIR) if name.startswith(prefixes)]


def _warm_up(strategy: str) -> None:
    # Start what lives on after an executor (the forkserver, the resource
    # tracker) before the baseline is taken.
    ex = offload.get_executor(strategy, **small_options(strategy))
    ex.submit(helpers.tagged_payload, 0, False, 0.0, helpers.tag_bytes(0, LARGE)).result(HANG_LIMIT)
    ex.shutdown(wait=True)
    for backend in BACKENDS:
        name, options = backend.values[0]
        # A loop's first run may open what lives on (libuv's signal pipe).
        anyio.run(anyio.sleep, 0, backend=name, backend_options=options)


#: Modest, to keep the run to about a minute on two busy cores; raise locally
#: (HYPOTHESIS profile or this dict) to search harder.
EXAMPLES = {"inline": 30, "thread": 30, "process": 25, "async-renderer": 30}


@pytest.mark.parametrize("strategy", offload.STRATEGIES)
def test_random_interleavings_end_every_call_once_and_leak_nothing(strategy: str) -> None:
    _warm_up(strategy)

    @settings(
        max_examples=EXAMPLES.get(strategy, 10),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(steps=actions, backend=st.sampled_from([b.values[0] for b in BACKENDS]))
    def example(steps: list[tuple[Any, ...]], backend: tuple[str, dict[str, Any]]) -> None:
        fds, children, threads = _fds(), _children(), _offload_threads()
        scenario = Scenario(strategy)
        ex = offload.get_executor(strategy, **small_options(strategy, lanes=LANES))
        try:
            name, options = backend
            try:
                anyio.run(_drive, ex, scenario, steps, backend=name, backend_options=options)
            finally:
                threading.stack_size(0)
            if scenario.threadless and not scenario.shut:
                # Threads can start again: so can the executor's workers.
                assert ex.submit(helpers.tagged, -1, False, 0.0).result(HANG_LIMIT) == ("result", -1)
            futures = [r.future for r in scenario.records if r.future is not None]
            _, pending = concurrent.futures.wait(futures, timeout=HANG_LIMIT)
            assert not pending, f"{len(pending)} futures never ended"
        finally:
            if strategy == "process":
                scenario.worker_pids.update(ex.strategy.worker_pids())  # type: ignore[attr-defined]
            stopper = threading.Thread(target=ex.shutdown, daemon=True)
            stopper.start()
            stopper.join(HANG_LIMIT)
            assert not stopper.is_alive(), "shutdown(wait=True) hung"
        _check(scenario)
        assert _offload_threads() <= threads, "worker threads left behind"
        assert _children() <= children, "worker processes left behind"
        assert _shm_files({os.getpid(), *scenario.worker_pids}) == [], "/dev/shm files left behind"
        assert _fds() <= fds, f"file descriptors left behind: {_fds() - fds}"

    example()
