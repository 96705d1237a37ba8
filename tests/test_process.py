"""The `process` strategy's own promises: crash isolation, pickling errors,
per-worker initializers, recycling, cancellation by kill, shared memory, and
no worker process left behind. Timing bounds are wide on purpose (the test
machine is small and shared); exact speeds are in `benchmarks/results/latest/process/`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
import psutil
import pytest

import offload
from offload._strategies import _wire
from offload._strategies._process import ProcessStrategy

from . import helpers
from .helpers import TIMEOUT
from .in_subprocess import check, run_python

ROOT = Path(__file__).resolve().parent.parent


def process_executor(**options: Any) -> offload.Executor:
    options.setdefault("max_workers", 2)
    ex = offload.get_executor("process", **options)
    assert isinstance(ex.strategy, ProcessStrategy)
    return ex


@pytest.fixture
def ex() -> Iterator[offload.Executor]:
    executor = process_executor()
    try:
        yield executor
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


def wait_for(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {predicate}"
        time.sleep(0.02)


async def until(predicate: Any) -> None:
    """Poll a condition that another process changes (there is no event to wait on)."""
    while not predicate():  # noqa: ASYNC110 (state lives in another process)
        await anyio.sleep(0.02)


def gone(pid: int) -> bool:
    """The process no longer exists, not even as an unreaped zombie."""
    try:
        psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return True
    return False


def exited(pid: int) -> bool:
    """The process has ended (reaping an orphan is the init process's job, not ours)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def pids_in(directory: Path) -> list[int]:
    return [int(name) for name in os.listdir(directory)]


def our_shm_files(workers: Any) -> list[str]:
    """Shared-memory files left by this process or by `workers` (pids)."""
    if not _wire.SHM_AVAILABLE:
        return []
    prefixes = tuple(_wire.shm_prefix(p) for p in (os.getpid(), *workers))
    return [n for n in os.listdir(_wire.SHM_DIR) if n.startswith(prefixes)]


# ---- crashes -------------------------------------------------------------------


@pytest.mark.anyio
async def test_sigkill_mid_call_fails_only_that_call(ex: offload.Executor, tmp_path: Path) -> None:
    outcome: dict[str, Any] = {}

    async def victim() -> None:
        started = time.monotonic()
        try:
            await ex.run(helpers.write_pid_and_sleep, str(tmp_path), 60)
        except offload.WorkerCrashed as exc:
            outcome["error"], outcome["after"] = exc, time.monotonic() - started

    async def bystander() -> None:
        outcome["other"] = await ex.run(helpers.sleep_and_return, 1.0, "fine")

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(victim)
            tg.start_soon(bystander)
            await until(lambda: os.listdir(tmp_path))
            killed_at = time.monotonic()
            (pid,) = pids_in(tmp_path)
            os.kill(pid, signal.SIGKILL)
    assert isinstance(outcome["error"], offload.WorkerCrashed)
    assert isinstance(outcome["error"], offload.OffloadError)
    assert "SIGKILL" in str(outcome["error"])
    assert str(pid) in str(outcome["error"])
    assert time.monotonic() - killed_at < 30  # "within a second" is measured in the benchmark
    assert outcome["other"] == "fine"
    assert await ex.run(helpers.add, 1, 2) == 3
    with anyio.fail_after(30):
        await until(lambda: len(ex.strategy.worker_pids()) == 2 and pid not in ex.strategy.worker_pids())
    assert all(not gone(p) for p in ex.strategy.worker_pids())


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("fn", "args", "expected"),
    [
        (helpers.exit_abruptly, (3,), "exited with code 3"),
        (helpers.segfault, (), "SIGSEGV"),
    ],
    ids=["os._exit", "segfault"],
)
async def test_other_deaths_name_the_exit(ex: offload.Executor, fn: Any, args: Any, expected: str) -> None:
    with anyio.fail_after(60), pytest.raises(offload.WorkerCrashed, match=expected):
        await ex.run(fn, *args)
    assert await ex.run(helpers.add, 2, 2) == 4


def test_hundred_kills_leave_no_zombie_or_orphan(tmp_path: Path) -> None:
    me = psutil.Process()
    children_before = {p.pid for p in me.children(recursive=True)}
    ex = process_executor()
    try:
        futures = [ex.submit(helpers.kill_self, str(tmp_path)) for _ in range(100)]
        for future in futures:
            with pytest.raises(offload.WorkerCrashed, match="SIGKILL"):
                future.result(timeout=120)
        assert ex.submit(helpers.add, 1, 1).result(timeout=60) == 2
        survivors = ex.strategy.worker_pids()
    finally:
        ex.shutdown(wait=True)
    killed = pids_in(tmp_path)
    assert len(killed) == 100
    workers = {*killed, *survivors}

    def leftover(child: psutil.Process) -> bool:
        # Below the test process, only multiprocessing's own servers (forkserver,
        # resource tracker) may remain: no worker, and no zombie.
        if child.pid in workers:
            return True
        try:
            return child.pid not in children_before and child.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    wait_for(
        lambda: all(gone(p) for p in workers)
        and not any(leftover(c) for c in me.children(recursive=True))
    )
    assert our_shm_files(workers) == []


@pytest.mark.anyio
async def test_worker_dying_while_idle_is_replaced_quietly(ex: offload.Executor) -> None:
    first = await ex.run(helpers.pid)
    os.kill(first, signal.SIGKILL)
    await anyio.to_thread.run_sync(wait_for, lambda: gone(first))
    assert await ex.run(helpers.pid) != first


# ---- pickling --------------------------------------------------------------------


@pytest.mark.anyio
async def test_unpicklable_function_and_argument_raise_type_error(ex: offload.Executor) -> None:
    def local() -> int:
        return 1

    with pytest.raises(TypeError, match="function .*local.* cannot be pickled"):
        await ex.run(local)
    with pytest.raises(TypeError, match="argument 1 \\(lock\\) cannot be pickled"):
        await ex.run(helpers.echo_args, 1, threading.Lock())
    with pytest.raises(TypeError, match="keyword argument 'k'"):
        await ex.run(helpers.echo_args, k=lambda: 0)
    # Nothing was left queued or stuck: the pool still serves both workers.
    results = []
    async with anyio.create_task_group() as tg:
        for i in range(4):

            async def one(i: int = i) -> None:
                results.append(await ex.run(helpers.add, i))

            tg.start_soon(one)
    assert sorted(results) == [0, 1, 2, 3]


@pytest.mark.anyio
async def test_unpicklable_result_and_exception(ex: offload.Executor) -> None:
    with pytest.raises(TypeError, match="result .*could not be pickled"):
        await ex.run(helpers.return_unpicklable)
    with pytest.raises(offload.OffloadError, match="UnpicklableError: kept"):
        await ex.run(helpers.raise_unpicklable, "kept")
    with pytest.raises(offload.OffloadError, match="could not be unpickled here"):
        await ex.run(helpers.return_arrives_broken)
    assert await ex.run(helpers.add, 5) == 5


@pytest.fixture(scope="module")
def decorator_executor() -> Iterator[offload.Executor]:
    yield helpers.DECORATOR_EXECUTOR
    helpers.DECORATOR_EXECUTOR.shutdown()


@pytest.mark.anyio
async def test_a_function_decorated_with_make_async_runs_in_a_worker(
    decorator_executor: offload.Executor,
) -> None:
    doubled, worker = await helpers.doubled_in_a_process(21)
    assert doubled == 42
    assert worker in decorator_executor.strategy.worker_pids()


# ---- worker state and recycling ------------------------------------------------


@pytest.mark.anyio
async def test_initializer_runs_once_per_worker_across_1000_calls(tmp_path: Path) -> None:
    ex = process_executor(initializer=helpers.count_init, initargs=(str(tmp_path),))
    try:
        seen: set[tuple[int, int]] = set()

        async def batch() -> None:
            for _ in range(100):
                seen.add(await ex.run(helpers.state_and_pid))

        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(batch)
    finally:
        await ex.aclose()
    init_pids = pids_in(tmp_path)
    assert 1 <= len(init_pids) <= 2
    for p in init_pids:
        assert (tmp_path / str(p)).read_text() == "init\n"
    # worker_state() is what that worker's initializer returned (its own pid).
    assert all(state == p for state, p in seen)
    assert {p for _, p in seen} <= set(init_pids)


@pytest.mark.anyio
async def test_failing_initializer_fails_the_call(ex: offload.Executor) -> None:
    bad = process_executor(initializer=helpers.fail_init)
    try:
        with pytest.raises(offload.OffloadError, match="initializer broke"):
            await bad.run(helpers.add, 1)
    finally:
        await bad.aclose()


def test_a_worker_not_ready_within_worker_start_timeout_is_killed_and_its_call_fails(tmp_path: Path) -> None:
    ex = process_executor(
        max_workers=1,
        initializer=helpers.write_pid_and_sleep,
        initargs=(str(tmp_path), 30),
        worker_start_timeout=1,
    )
    try:
        with pytest.raises(offload.OffloadError, match=r"not ready within 1 s \(its initializer .*write_pid_and_sleep"):
            ex.submit(helpers.add, 1).result(timeout=TIMEOUT)
        (first,) = pids_in(tmp_path)
        assert gone(first)  # killed and reaped, not left to finish its sleep
        # The next call tries a fresh worker, which gets the same bounded wait.
        with pytest.raises(offload.OffloadError, match="not ready within 1 s"):
            ex.submit(helpers.add, 1).result(timeout=TIMEOUT)
        assert len(pids_in(tmp_path)) == 2
        assert all(gone(p) for p in pids_in(tmp_path))
    finally:
        ex.shutdown(wait=True)


@pytest.mark.parametrize("where", ["initializer", "before-main"])
def test_a_worker_that_never_becomes_ready_fails_start_and_calls_and_shutdown_returns(
    where: str, tmp_path: Path
) -> None:
    # "before-main": the worker blocks unpickling its start arguments, so its
    # interpreter never reaches offload's code (no initializer ever runs).
    options: dict[str, Any] = (
        {"initializer": helpers.block_forever, "initargs": (str(tmp_path),)}
        if where == "initializer"
        else {"initializer": helpers.identity, "initargs": (helpers.BlocksWhenUnpickled(str(tmp_path)),)}
    )
    ex = process_executor(max_workers=1, worker_start_timeout=0.5, **options)
    stopper = None
    try:
        with pytest.raises(offload.OffloadError, match="not ready within 0.5 s"):
            ex.start()
        with pytest.raises(offload.OffloadError, match="not ready within 0.5 s"):
            ex.submit(helpers.add, 1).result(timeout=TIMEOUT)
        queued = ex.submit(helpers.add, 2)  # its worker is starting when shutdown begins
        # Under load an interpreter can take longer than the 0.5 s to write its
        # pid, and is stopped before it does: then the queued call fails first.
        wait_for(lambda: len(pids_in(tmp_path)) == 3 or queued.done())
    finally:
        stopper = threading.Thread(target=ex.shutdown, kwargs={"wait": True})
        stopper.start()
        stopper.join(TIMEOUT)
    assert not stopper.is_alive(), "shutdown hung on a worker that never became ready"
    with pytest.raises(offload.OffloadError, match="not ready within 0.5 s"):
        queued.result(timeout=0)
    assert all(gone(p) for p in pids_in(tmp_path))


def test_a_slow_initializer_under_the_default_worker_start_timeout_starts(tmp_path: Path) -> None:
    ex = process_executor(max_workers=1, initializer=helpers.write_pid_and_sleep, initargs=(str(tmp_path), 3))
    try:
        assert ex.submit(helpers.pid).result(timeout=TIMEOUT) == pids_in(tmp_path)[0]
    finally:
        ex.shutdown(wait=True)


@pytest.mark.anyio
async def test_max_tasks_per_worker_replaces_on_schedule() -> None:
    ex = process_executor(max_workers=1, max_tasks_per_worker=3)
    try:
        pids = [await ex.run(helpers.pid) for _ in range(10)]
    finally:
        await ex.aclose()
    runs = [pids[i : i + 3] for i in range(0, 10, 3)]
    assert all(len(set(run)) == 1 for run in runs)
    assert len({run[0] for run in runs}) == 4


@pytest.mark.anyio
async def test_memory_ceiling_replaces_a_grown_worker() -> None:
    ceiling = 200 << 20
    ex = process_executor(max_workers=1, max_worker_memory=ceiling)
    try:
        rss, first = await ex.run(helpers.rss_and_pid)
        if rss > ceiling // 2:
            pytest.skip(f"a bare worker already uses {rss >> 20} MiB")
        assert await ex.run(helpers.pid) == first  # under the ceiling: kept
        assert await ex.run(helpers.leak, 256) == first  # the call that grew it still answers
        assert await ex.run(helpers.pid) != first
    finally:
        await ex.aclose()


# ---- cancellation ----------------------------------------------------------------


@pytest.mark.anyio
async def test_cancel_kill_terminates_and_replaces_the_worker(tmp_path: Path) -> None:
    ex = process_executor(max_workers=1, cancel="kill")
    try:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ex.run, helpers.write_pid_and_sleep, str(tmp_path), 60)
                await until(lambda: os.listdir(tmp_path))
                tg.cancel_scope.cancel()
        (victim,) = pids_in(tmp_path)
        await anyio.to_thread.run_sync(wait_for, lambda: gone(victim))
        assert await ex.run(helpers.pid) != victim
    finally:
        await ex.aclose()


def test_bad_options_are_config_errors() -> None:
    for options in (
        {"cancel": "stop"},
        {"start_method": "fork"},
        {"max_tasks_per_worker": 0},
        {"max_worker_memory": -1},
        {"shared_memory_threshold": 0},
        {"worker_start_timeout": 0},
        {"worker_start_timeout": -1},
        {"worker_start_timeout": float("nan")},
        {"worker_start_timeout": "60"},
    ):
        with pytest.raises(offload.ConfigError):
            offload.get_executor("process", **options)


# ---- shared memory -----------------------------------------------------------------


@pytest.mark.anyio
async def test_large_payloads_round_trip_through_shared_memory(ex: offload.Executor) -> None:
    import torch

    big = np.random.default_rng(0).standard_normal((512, 1024))  # 4 MiB
    small = np.arange(10)
    raw = helpers.make_bytes(3 << 20)
    tensor = torch.arange(1 << 19, dtype=torch.float32)  # 2 MiB
    for value in (big, small, [big, {"x": big[:2]}]):
        result = await ex.run(helpers.identity, value)
        assert type(result) is type(value)
    assert np.array_equal(await ex.run(helpers.identity, big), big)
    assert np.array_equal(await ex.run(helpers.identity, small), small)
    nested = await ex.run(helpers.identity, [big, {"x": big[:2]}])
    assert np.array_equal(nested[0], big)
    assert np.array_equal(nested[1]["x"], big[:2])
    back = await ex.run(helpers.identity, raw)
    assert type(back) is bytes
    assert back == raw
    assert await ex.run(helpers.describe, raw) == ("bytes", len(raw))
    assert await ex.run(helpers.describe, bytearray(raw)) == ("bytearray", len(raw))
    t_back = await ex.run(helpers.identity, tensor)
    assert isinstance(t_back, torch.Tensor)
    assert torch.equal(t_back, tensor)
    made = await ex.run(helpers.make_array, 1 << 20)  # 8 MiB made in the worker
    assert made.shape == (1 << 20,)
    assert made[-1] == (1 << 20) - 1
    made[0] = 42.0  # a private, writable array
    assert made[0] == 42.0
    assert our_shm_files(ex.strategy.worker_pids()) == []


@pytest.mark.anyio
async def test_payloads_without_shared_memory(tmp_path: Path) -> None:
    ex = process_executor(max_workers=1, shared_memory_threshold=None)
    try:
        big = np.ones(1 << 20)
        assert np.array_equal(await ex.run(helpers.identity, big), big)
    finally:
        await ex.aclose()


# ---- lifetime ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_shutdown_leaves_no_worker_process(tmp_path: Path) -> None:
    ex = process_executor()
    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(ex.run, helpers.sleep_and_return, 0.2)
    pids = ex.strategy.worker_pids()
    assert len(pids) == 2
    await ex.aclose()
    assert all(gone(p) for p in pids)


PARENT_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import offload
    from tests import helpers

    if __name__ == "__main__":
        ex = offload.get_executor("process", max_workers=2)
        busy = ex.submit(helpers.sleep_and_return, 120)  # one worker mid-call
        ex.submit(helpers.add, 1).result(timeout=60)
        print(" ".join(map(str, ex.strategy.worker_pids())), flush=True)
        time.sleep(120)
    """
)


def test_workers_exit_when_the_parent_dies(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(PARENT_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen(
        [sys.executable, str(script)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        workers = [int(p) for p in line.split()]
        assert len(workers) == 2, line
        # Everything the parent started (the workers, and multiprocessing's
        # forkserver and resource tracker) must go when it is killed.
        descendants = [p.pid for p in psutil.Process(parent.pid).children(recursive=True)]
        assert set(workers) <= set(descendants)
        parent.kill()
        parent.wait(timeout=30)
        wait_for(lambda: all(exited(p) for p in descendants), timeout=60)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


def test_worker_is_quiet_when_the_parent_goes_away() -> None:
    result = run_python(
        """
        import multiprocessing, pickle, time
        from offload._strategies import _child_main

        if __name__ == "__main__":
            ctx = multiprocessing.get_context("spawn")
            parent_end, child_end = ctx.Pipe()
            alive_r, alive_w = ctx.Pipe(duplex=False)
            worker = ctx.Process(target=_child_main.main, args=(child_end, alive_r, None, (), None, None))
            worker.start()
            child_end.close()
            assert pickle.loads(parent_end.recv_bytes()) == ("ready",)
            parent_end.send_bytes(pickle.dumps((time.sleep, (0.5,), {})))
            parent_end.close()  # gone before the reply
            worker.join(30)
            print("exit", worker.exitcode)
        """
    )
    assert check(result).strip() == "exit 0"
    assert "Traceback" not in result.stderr, result.stderr
    assert "BrokenPipe" not in result.stderr


@pytest.mark.anyio
async def test_kill_on_cancel_catches_a_call_cancelled_before_it_reached_its_worker(tmp_path: Path) -> None:
    marker = str(tmp_path / "ran")
    helpers.PICKLING.clear()
    ex = offload.get_executor("process", max_workers=1, cancel="kill")
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ex.run, helpers.mark, marker, helpers.SlowToPickle())
            # Claimed, and being pickled in the slot's thread.
            await anyio.to_thread.run_sync(helpers.PICKLING.wait, TIMEOUT)
            tg.cancel_scope.cancel()
        assert await ex.run(helpers.add, 1, 2) == 3  # the slot is past that call
    finally:
        ex.shutdown(wait=True)
    assert not Path(marker).exists()  # noqa: ASYNC240 (after the executor is gone)
