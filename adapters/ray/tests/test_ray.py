"""The `ray` strategy on a local Ray instance: what the contract suite cannot show."""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import psutil
import pytest
import ray
from offload_ray import RayStrategy
from offload_ray._arguments import through_object_store

import offload

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("local_ray")]

# Actors cannot import this test module: its functions travel by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def pid() -> int:
    return os.getpid()


def slow_pid(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def report_pid_then_sleep(path: str, seconds: float) -> int:
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(seconds)
    return os.getpid()


def writeable(array: Any) -> bool:
    return bool(array.flags.writeable)


class Unpicklable(Exception):
    def __init__(self) -> None:
        super().__init__("has a lock")
        self.lock = threading.Lock()

    def __reduce__(self) -> Any:
        raise TypeError("cannot pickle this exception")


def raise_unpicklable() -> None:
    raise Unpicklable()


class Refused(Exception):
    """Crosses to the actors by value, as a class of the caller's `__main__`
    would: they cannot import this module."""


def refuse() -> None:
    raise Refused("not this one")


def recurse(n: int) -> int:
    if n == 0:
        raise ValueError("deep")
    return recurse(n - 1) + 1


def fail_init() -> None:
    raise RuntimeError("no tokenizer here")


def actor_processes() -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if "ray::RayWorker" in cmdline:
            found.append(process)
    return found


async def test_registered_under_its_name() -> None:
    assert "ray" in offload.STRATEGIES
    ex = offload.get_executor("ray", max_workers=1)
    assert isinstance(ex.strategy, RayStrategy)
    wrapped = offload.make_async(pid, strategy="ray", max_workers=1)
    try:
        assert await wrapped() != os.getpid()
    finally:
        wrapped.executor.shutdown()  # type: ignore[attr-defined]
        ex.shutdown()


async def test_killed_actor_fails_its_call_and_is_replaced(tmp_path: Path) -> None:
    async with offload.Executor(RayStrategy(2)) as ex:
        before = {await ex.run(pid) for _ in range(2)}
        with anyio.fail_after(120):
            while len(ex.strategy.actors()) < 2:  # noqa: ASYNC110 (polling state Ray changes)
                await anyio.sleep(0.1)
        marker = tmp_path / "pid"
        outcome: list[Any] = []
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:

                async def victim() -> None:
                    try:
                        outcome.append(await ex.run(report_pid_then_sleep, str(marker), 60))
                    except offload.WorkerCrashed as exc:
                        outcome.append(exc)

                tg.start_soon(victim)
                while not marker.exists() or not marker.read_text():  # noqa: ASYNC110 (polling state Ray changes)
                    await anyio.sleep(0.05)
                victim_pid = int(marker.read_text())
                os.kill(victim_pid, signal.SIGKILL)
        assert len(outcome) == 1
        assert isinstance(outcome[0], offload.WorkerCrashed), outcome
        assert "died" in str(outcome[0])
        # By the time its caller hears of it, the dead actor has left the pool.
        for actor in ex.strategy.actors():
            ray.get(actor.where.remote(), timeout=60)
        # The pool is back to two actors, one of them new, and both serve calls.
        with anyio.fail_after(120):
            while len(ex.strategy.actors()) < 2:  # noqa: ASYNC110 (polling state Ray changes)
                await anyio.sleep(0.1)
        pids = {ray.get(actor.where.remote())[1] for actor in ex.strategy.actors()}
        assert len(pids) == 2, (before, victim_pid, pids)
        assert victim_pid not in pids, (before, victim_pid, pids)
        served: set[int] = set()
        with anyio.fail_after(120):
            while served != pids:
                async with anyio.create_task_group() as tg:
                    for _ in range(2):
                        tg.start_soon(one_into, ex, served)
        assert served == pids


async def one_into(ex: offload.Executor, pids: set[int]) -> None:
    pids.add(await ex.run(slow_pid, 0.5))


async def test_large_arguments_go_through_the_object_store() -> None:
    async with offload.Executor(RayStrategy(1, object_store_threshold=64 << 10)) as ex:
        large, small = np.ones(1 << 20, dtype=np.uint8), np.ones(1 << 10, dtype=np.uint8)
        args, kwargs, stored = through_object_store((large, small), {"data": b"x" * (64 << 10)}, 64 << 10)
        assert isinstance(args[0], ray.ObjectRef)
        assert args[1] is small
        assert isinstance(kwargs["data"], ray.ObjectRef)
        assert len(stored) == 2
        # The actor gets the array itself, as a read-only zero-copy view of the store.
        assert await ex.run(writeable, large) is False
        assert await ex.run(np.sum, large) == 1 << 20


async def test_exceptions_keep_their_type_or_say_why_not() -> None:
    async with offload.Executor(RayStrategy(1)) as ex:
        with pytest.raises(ValueError, match="deep"):
            await ex.run(recurse, 700)
        with pytest.raises(offload.OffloadError, match="cannot be pickled") as info:
            await ex.run(raise_unpicklable)
        assert "Unpicklable" in str(info.value)
        # A class the actor has only by value comes back as itself, with the function's frames.
        with pytest.raises(Refused, match="not this one") as refused:
            await ex.run(refuse)
        assert "refuse" in {frame.name for frame in refused.traceback}


async def test_an_unserializable_argument_fails_that_call_only() -> None:
    async with offload.Executor(RayStrategy(1)) as ex:
        with pytest.raises(TypeError, match="could not be sent"):
            await ex.run(pid, threading.Lock())
        assert await ex.run(pid) != os.getpid()


async def test_failing_initializer_fails_the_call_and_is_retried() -> None:
    async with offload.Executor(RayStrategy(1, initializer=fail_init)) as ex:
        for _ in range(2):
            with pytest.raises(offload.OffloadError, match="initializer") as info:
                await ex.run(pid)
            assert isinstance(info.value.__cause__, RuntimeError)


async def test_unplaceable_actor_fails_the_call_instead_of_hanging() -> None:
    async with offload.Executor(RayStrategy(1, resources={"no-such-resource": 1}, actor_start_timeout=2)) as ex:
        with pytest.raises(offload.OffloadError, match="no actor started") as info:
            await ex.run(pid)
    assert "none was placed (the cluster has " in str(info.value), info.value


def exit_at_once() -> None:
    os._exit(3)


async def test_an_actor_that_dies_in_its_initializer_fails_the_call_as_a_crash() -> None:
    async with offload.Executor(RayStrategy(1, initializer=exit_at_once, actor_start_timeout=60)) as ex:
        with pytest.raises(offload.WorkerCrashed, match="died while running its initializer"):
            await ex.run(pid)


def sleep_forever() -> None:
    time.sleep(3600)


async def test_a_placed_actor_whose_initializer_hangs_fails_the_call_saying_so() -> None:
    """The time to be placed and the initializer's are told apart: the error
    names the initializer, and the actor is not left running it."""
    strategy = RayStrategy(1, initializer=sleep_forever, actor_start_timeout=3)
    began = time.monotonic()
    async with offload.Executor(strategy) as ex:
        with pytest.raises(offload.OffloadError, match="initializer 'sleep_forever' had not returned") as info:
            await ex.run(pid)
    assert time.monotonic() - began < 60
    placed = re.search(r"was placed \(pid (\d+) on node ", str(info.value))
    assert placed, info.value
    # Killed by the failed start: gone within Ray's kill (a fraction of a second).
    try:
        psutil.Process(int(placed[1])).wait(timeout=30)
    except psutil.NoSuchProcess:
        pass
    except psutil.TimeoutExpired:
        pytest.fail("the actor still runs its initializer")


async def test_shutdown_leaves_no_actor_behind() -> None:
    ex = offload.Executor(RayStrategy(3))
    pids = {await ex.run(slow_pid, 0.3) for _ in range(6)}
    assert pids <= {p.pid for p in actor_processes()}
    await ex.aclose()
    with anyio.fail_after(30):
        while pids & {p.pid for p in actor_processes()}:  # noqa: ASYNC110 (polling state Ray changes)
            await anyio.sleep(0.1)
    assert ex.strategy.actors() == []


async def test_bad_options_fail_at_construction() -> None:
    with pytest.raises(offload.ConfigError, match="max_workers"):
        offload.Executor(RayStrategy(0))
    with pytest.raises(offload.ConfigError, match="num_cpus"):
        offload.Executor(RayStrategy(1, num_cpus=-1))
    with pytest.raises(offload.ConfigError, match="address"):
        offload.Executor(RayStrategy(1, address=""))
    with pytest.raises(offload.ConfigError, match="must not hold 'address'"):
        offload.Executor(RayStrategy(1, ray_init_options={"address": "local"}))
    with pytest.raises(offload.ConfigError, match="resources"):
        offload.Executor(RayStrategy(1, resources={"gpu_like": -2}))
    with pytest.raises(offload.ConfigError, match="actor_stop_timeout"):
        offload.Executor(RayStrategy(1, actor_stop_timeout=0))
    with pytest.raises(offload.ConfigError, match="takes no option"):
        offload.get_executor("ray", num_gpus=1)


async def test_start_places_every_actor_before_the_first_call() -> None:
    ex = offload.Executor(RayStrategy(2))
    try:
        await anyio.to_thread.run_sync(ex.start)
        actors = ex.strategy.actors()
        assert len(actors) == 2
        await anyio.to_thread.run_sync(ex.start)  # idempotent
        assert ex.strategy.actors() == actors
        pids = {await ex.run(slow_pid, 0.2) for _ in range(6)}
        assert ex.strategy.actors() == actors  # the calls used the actors start() made
        assert len(pids) <= 2
    finally:
        await ex.aclose()
    with pytest.raises(offload.ExecutorClosed):
        ex.start()


async def test_start_reports_a_failing_initializer_and_the_pool_retries() -> None:
    async with offload.Executor(RayStrategy(1, initializer=fail_init)) as ex:
        with pytest.raises(offload.OffloadError, match="initializer"):
            await anyio.to_thread.run_sync(ex.start)
        # Not reported a second time to the next call: that one starts a fresh actor (which fails again).
        with pytest.raises(offload.OffloadError, match="initializer"):
            await ex.run(pid)


def pid_once_open(gate: str) -> int:
    """Hold the call until the file `gate` exists (at most 60 s), then the actor's pid."""
    deadline = time.monotonic() + 60
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.005)
    return os.getpid()


async def test_max_queue_refuses_calls_past_the_bound_at_once(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    async with offload.Executor(RayStrategy(1), max_queue=2) as ex:
        await anyio.to_thread.run_sync(ex.start)
        assert ex.max_queue == 2
        # Held until both refusals are seen, however long they take (a fixed
        # sleep per call cost 3 s a backend).
        futures = [ex.submit(pid_once_open, str(gate)) for _ in range(3)]  # one runs, two wait
        try:
            with pytest.raises(offload.Overloaded):
                ex.submit(slow_pid, 0)
            with pytest.raises(offload.Overloaded):
                await ex.run(pid)
        finally:
            gate.touch()
        assert len({f.result(timeout=60) for f in futures}) == 1


async def test_aclose_timeout_kills_actors_still_running_a_call() -> None:
    ex = offload.Executor(RayStrategy(1))
    await anyio.to_thread.run_sync(ex.start)
    (actor_pid,) = {p.pid for p in actor_processes()} & {await ex.run(pid)}
    running = ex.submit(slow_pid, 60)
    queued = ex.submit(pid)
    await anyio.sleep(0.5)
    with anyio.fail_after(30):
        await ex.aclose(timeout=0.5)
    with pytest.raises(offload.WorkerCrashed):
        running.result(timeout=30)
    assert queued.cancelled()  # a queued call's future is cancelled, as by shutdown(cancel_futures=True)
    with anyio.fail_after(30):
        while actor_pid in {p.pid for p in actor_processes()}:  # noqa: ASYNC110 (polling state Ray changes)
            await anyio.sleep(0.1)
