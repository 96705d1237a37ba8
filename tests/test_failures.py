"""Failure paths: each test injects a real failure (rlimits, fork,
SIGKILL, a full /dev/shm, cancellation) and fails on the code before the fix.

Tests that could hang on a regression run their scenario in a subprocess with
a timeout, so a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

import offload
from offload._config import max_workers_from_env
from offload._strategies import _encoding, _wire

from . import helpers
from .conftest import has_pool, small_options

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
#: The `offload` under test (a checkout of older code can be put first on PYTHONPATH).
OFFLOAD_ROOT = Path(offload.__file__).resolve().parent.parent

#: Generous: these bound hangs, they do not measure anything.
TIMEOUT = 60


def run_python(code: str, timeout: float = TIMEOUT, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter that imports this `offload` and `tests`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        dict.fromkeys([str(OFFLOAD_ROOT), str(ROOT), env.get("PYTHONPATH", "")])
    ).rstrip(os.pathsep)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        check=False,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
        **kwargs,
    )


def check(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture
def process_ex() -> Any:
    ex = offload.get_executor("process", max_workers=1)
    yield ex
    ex.shutdown(wait=True, cancel_futures=True)


# ---- 1. a failed receive never shifts replies onto later calls ----------------


async def test_worker_out_of_fds_fails_one_call_and_never_shifts_replies(process_ex: offload.Executor) -> None:
    await process_ex.run(helpers.limit_open_files)
    # The worker cannot open the arena of a 1 MiB argument.
    with pytest.raises(Exception, match="Too many open files"):
        await process_ex.run(helpers.identity, b"x" * (1 << 20))
    assert [await process_ex.run(helpers.identity, tag) for tag in "ABC"] == ["A", "B", "C"]


@pytest.mark.parametrize(
    ("threshold", "headroom_mib", "expected"),
    [
        # Through shared memory: the frame arrives whole, only the copy fails.
        ("262144", 96, "could not be unpickled"),
        # Through the pipe, with no room to read the frame itself: the stream
        # is out of step, so the worker must be replaced.
        ("None", 32, "was replaced"),
    ],
    ids=["shared-memory", "pipe"],
)
def test_parent_out_of_memory_for_a_reply_never_shifts_replies(
    threshold: str, headroom_mib: int, expected: str
) -> None:
    # RLIMIT_AS leaves room to map a 64 MiB reply but not to copy it out.
    out = check(
        run_python(
            f"""
            import resource
            import offload
            from tests import helpers

            def vm_size():
                with open("/proc/self/status") as f:
                    for line in f:
                        if line.startswith("VmSize:"):
                            return int(line.split()[1]) * 1024

            if __name__ == "__main__":
                ex = offload.get_executor(
                    "process", max_workers=1, shared_memory_threshold={threshold}
                )
                assert ex.submit(helpers.make_bytes, 1 << 20).result(timeout=60)
                soft, hard = resource.getrlimit(resource.RLIMIT_AS)
                resource.setrlimit(resource.RLIMIT_AS, (vm_size() + ({headroom_mib} << 20), hard))
                try:
                    ex.submit(helpers.make_bytes, 64 << 20).result(timeout=60)
                except MemoryError:
                    print("raw MemoryError")
                except Exception as exc:
                    print("failed:", type(exc).__name__, exc)
                else:
                    print("no failure")
                resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
                print([ex.submit(helpers.identity, t).result(timeout=60) for t in "ABC"])
                ex.shutdown()
            """
        )
    )
    # The limit must have bitten (else this tests nothing), as an OffloadError
    # of that call alone, and later calls get their own replies.
    assert "failed: OffloadError" in out, out
    assert expected in out, out
    assert "['A', 'B', 'C']" in out, out


# ---- 2. a full /dev/shm never kills the process with SIGBUS ------------------


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        probe = subprocess.run(
            ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
            capture_output=True,
            check=False,
            timeout=TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def test_payload_larger_than_free_shm_goes_through_the_pipe() -> None:
    if not _unshare_works():
        pytest.skip("needs `unshare -rm` (a private mount namespace) to shrink /dev/shm")
    script = textwrap.dedent(
        """
        import numpy as np
        import offload
        from tests import helpers

        if __name__ == "__main__":
            with offload.get_executor("process", max_workers=1) as ex:
                array = np.ones(2 << 20)  # 16 MiB, /dev/shm has 8
                print("sent", ex.submit(helpers.describe, array).result(timeout=60))
                back = ex.submit(helpers.make_array, 2 << 20).result(timeout=60)
                print("received", back.nbytes, float(back[-1]))
        """
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(OFFLOAD_ROOT), str(ROOT)])
    result = subprocess.run(
        [
            "unshare", "-rm", "sh", "-c",
            'mount -t tmpfs -o size=8m tmpfs /dev/shm && exec "$0" -c "$1"',
            sys.executable, script,
        ],
        capture_output=True, check=False, text=True, timeout=TIMEOUT, cwd=ROOT, env=env,
    )
    out = check(result)
    assert "sent ('ndarray', 2097152)" in out
    assert f"received {16 << 20} {float((2 << 20) - 1)}" in out


# ---- 3. a failing initializer never strands queued calls ----------------------


def test_thread_failing_initializer_ends_every_queued_call() -> None:
    helpers.INIT_GATE.clear()
    ex = offload.get_executor("thread", max_workers=1, initializer=helpers.fail_after_gate)
    try:
        futures = [ex.submit(helpers.add, i) for i in range(4)]  # all queued behind the initializer
        helpers.INIT_GATE.set()
        _, pending = concurrent.futures.wait(futures, timeout=TIMEOUT)
        assert not pending
        for future in futures:
            with pytest.raises(offload.OffloadError, match="initializer"):
                future.result()
    finally:
        helpers.INIT_GATE.set()
        ex.shutdown(wait=True, cancel_futures=True)


def test_thread_shutdown_never_returns_with_calls_pending() -> None:
    helpers.INIT_GATE.clear()
    ex = offload.get_executor("thread", max_workers=1, initializer=helpers.fail_after_gate)
    futures = [ex.submit(helpers.add, i) for i in range(4)]
    stopper = threading.Thread(target=ex.shutdown, daemon=True)
    stopper.start()  # begins while the initializer runs
    helpers.INIT_GATE.set()
    stopper.join(TIMEOUT)
    assert not stopper.is_alive()
    assert all(f.done() for f in futures)


def test_renderer_initializer_failing_during_shutdown_ends_every_queued_call() -> None:
    helpers.INIT_GATE.clear()
    ex = offload.get_executor("async-renderer", initializer=helpers.fail_after_gate)
    try:
        futures = [ex.submit(helpers.add, i) for i in range(3)]
        ex.shutdown(wait=False)  # begins while the initializer runs
        helpers.INIT_GATE.set()
        _, pending = concurrent.futures.wait(futures, timeout=TIMEOUT)
        assert not pending
        for future in futures:
            with pytest.raises(offload.OffloadError, match="initializer"):
                future.result()
    finally:
        helpers.INIT_GATE.set()
        ex.shutdown(wait=True, cancel_futures=True)


def test_process_pipe_failure_fails_the_call_and_the_pool_recovers() -> None:
    out = check(
        run_python(
            """
            import concurrent.futures, os, resource, signal
            import offload
            from tests import helpers

            if __name__ == "__main__":
                ex = offload.get_executor("process", max_workers=1)
                (pid,) = {ex.submit(helpers.pid).result(timeout=60)}
                os.kill(pid, signal.SIGKILL)  # the next call must start a new worker
                lowest_free = os.open(os.devnull, os.O_RDONLY)
                os.close(lowest_free)
                soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
                resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
                futures = [ex.submit(helpers.add, i) for i in range(3)]
                done, pending = concurrent.futures.wait(futures, timeout=30)
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
                print("pending", len(pending))
                print("errors", sorted({type(f.exception()).__name__ for f in done}))
                print("after", ex.submit(helpers.add, 2, 3).result(timeout=60))
                ex.shutdown(cancel_futures=True)
            """
        )
    )
    assert "pending 0" in out
    # The first call may still find the killed worker and fail with WorkerCrashed.
    assert ("errors ['OffloadError']" in out) or ("errors ['OffloadError', 'WorkerCrashed']" in out), out
    assert "after 5" in out


# ---- 4. fork safety --------------------------------------------------------------


def test_an_executor_used_before_fork_works_in_the_child() -> None:
    out = check(
        run_python(
            """
            import os, time
            import anyio
            import offload
            from tests import helpers

            def in_child(ex):
                try:
                    ok = ex.submit(helpers.add, 1, 2).result(timeout=30) == 3
                    ok = ok and anyio.run(ex.run, helpers.add, 2, 2) == 4
                    ex.shutdown(wait=True)
                except BaseException:
                    os._exit(2)
                os._exit(0 if ok else 1)

            if __name__ == "__main__":
                for strategy in offload.STRATEGIES:
                    options = {"max_workers": 1} if strategy in ("thread", "process") else {}
                    ex = offload.get_executor(strategy, **options)
                    assert ex.submit(helpers.add, 1, 1).result(timeout=60) == 2
                    child = os.fork()
                    if child == 0:
                        in_child(ex)
                    deadline = time.monotonic() + 45
                    while not (status := os.waitpid(child, os.WNOHANG))[0]:
                        if time.monotonic() > deadline:
                            os.kill(child, 9)
                            status = os.waitpid(child, 0)
                            break
                        time.sleep(0.05)
                    code = os.waitstatus_to_exitcode(status[1])
                    print(strategy, "child", code, "parent", ex.submit(helpers.add, 5, 5).result(timeout=60))
                    ex.shutdown()
            """,
            timeout=4 * TIMEOUT,
        )
    )
    for strategy in offload.STRATEGIES:
        assert f"{strategy} child 0 parent 10" in out, out


def test_calls_in_flight_at_fork_do_not_count_against_the_childs_max_queue() -> None:
    # The parent's one worker is busy and its queue bound is 0 when it forks:
    # the child must not inherit that count and refuse every call.
    out = check(
        run_python(
            """
            import os, time
            import offload
            from tests import helpers

            if __name__ == "__main__":
                for strategy in ("thread", "process", "async-renderer"):
                    options = {"max_workers": 1} if strategy != "async-renderer" else {"max_batch_size": 1}
                    ex = offload.get_executor(strategy, max_queue=0, **options)
                    busy = ex.submit(helpers.sleep_and_return, 1.5, "parent")
                    time.sleep(0.3)
                    assert ex.overloaded
                    child = os.fork()
                    if child == 0:
                        try:
                            code = 0 if ex.submit(helpers.add, 1, 2).result(timeout=30) == 3 else 1
                        except BaseException as exc:
                            print(strategy, "child failed:", repr(exc), flush=True)
                            code = 2
                        os._exit(code)
                    _, status = os.waitpid(child, 0)
                    print(strategy, "child", os.waitstatus_to_exitcode(status), busy.result(timeout=30))
                    ex.shutdown()
            """,
            timeout=4 * TIMEOUT,
        )
    )
    for strategy in ("thread", "process", "async-renderer"):
        assert f"{strategy} child 0 parent" in out, out


# ---- 5. an already-cancelled caller never starts the call -----------------------

#: Before the fix, `fn` ran in 45 to 199 of 300 tries for thread and async-renderer.
TRIES = 300


async def test_already_cancelled_caller_never_starts_the_call(strategy: str, tmp_path: Path) -> None:
    marker = str(tmp_path / "ran")
    ex = offload.get_executor(strategy, **small_options(strategy))
    try:
        for _ in range(TRIES):
            with anyio.CancelScope() as scope:
                scope.cancel()
                await ex.run(helpers.mark, marker)
            assert scope.cancelled_caught
    finally:
        ex.shutdown(wait=True)
    assert not Path(marker).exists()  # noqa: ASYNC240 (after the executor is gone)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_already_cancelled_asyncio_task_never_starts_the_call(strategy: str, tmp_path: Path) -> None:
    import asyncio

    marker = str(tmp_path / "ran")
    ex = offload.get_executor(strategy, **small_options(strategy))

    async def cancelled_then_run() -> None:
        asyncio.current_task().cancel()  # type: ignore[union-attr]
        await ex.run(helpers.mark, marker)

    try:
        for _ in range(TRIES):
            with pytest.raises(asyncio.CancelledError):
                await asyncio.get_running_loop().create_task(cancelled_then_run())
    finally:
        ex.shutdown(wait=True)
    assert not Path(marker).exists()  # noqa: ASYNC240 (after the executor is gone)


# ---- 6. batch keys never crash the lane and are exact ------------------------------


def _batching_with_busy_lane() -> tuple[offload.Executor, Any, concurrent.futures.Future[Any]]:
    helpers.GATE.clear()
    ex = offload.get_executor("async-renderer")
    # What `make_async(tag_item, batch=tag_items)` hands this executor.
    target = ex.strategy.batch_form(helpers.tag_item, helpers.tag_items)
    busy = ex.submit(helpers.wait_gate)  # the lane is busy: the next calls queue
    return ex, target, busy


@pytest.mark.parametrize("kind", ["ambiguous", "tensor"])
def test_keyword_values_whose_equality_raises_never_kill_the_lane(kind: str) -> None:
    if kind == "tensor":
        torch = pytest.importorskip("torch")
        values: list[Any] = [torch.ones(3), torch.ones(3)]
    else:
        values = [helpers.Ambiguous(), helpers.Ambiguous()]
    ex, target, busy = _batching_with_busy_lane()
    try:
        futures = [ex.submit(target, i, k=values[i % 2]) for i in range(4)]
        helpers.GATE.set()
        _, pending = concurrent.futures.wait([busy, *futures], timeout=TIMEOUT)
        assert not pending
        for i, future in enumerate(futures):
            item, k = future.result()
            assert item == i
            assert k is values[i % 2]
        assert ex.submit(helpers.add, 1, 2).result(timeout=TIMEOUT) == 3
    finally:
        helpers.GATE.set()
        ex.shutdown(wait=True, cancel_futures=True)


def test_batch_keys_compare_types_all_the_way_down() -> None:
    ex, target, _ = _batching_with_busy_lane()
    values: list[Any] = [(1,), (True,), (1.0,), ((1, "a"),), ((True, "a"),), -0.0, 0.0, 0]
    try:
        futures = [ex.submit(target, i, k=value) for i, value in enumerate(values)]
        helpers.GATE.set()
        for i, (future, value) in enumerate(zip(futures, values, strict=True)):
            item, k = future.result(timeout=TIMEOUT)
            assert item == i
            assert repr(k) == repr(value)  # (True,) is not (1,), -0.0 is not 0.0
    finally:
        helpers.GATE.set()
        ex.shutdown(wait=True, cancel_futures=True)


# ---- 7. LoopLagMonitor leaves the body's exception alone ---------------------------


async def _raise_in_monitor() -> None:
    async with offload.LoopLagMonitor():
        await anyio.sleep(0.01)
        raise KeyError("body")


async def test_lag_monitor_raises_the_body_exception_unchanged() -> None:
    with pytest.raises(KeyError, match="body"):
        await _raise_in_monitor()


# ---- 8. interpreter exit never waits for a stuck process call --------------------


def test_exit_does_not_wait_for_a_running_process_call(tmp_path: Path) -> None:
    result = run_python(
        f"""
        import os, time
        import offload
        from tests import helpers

        if __name__ == "__main__":
            ex = offload.get_executor("process", max_workers=1)
            ex.submit(helpers.write_pid_and_sleep, {str(tmp_path)!r}, 3600)
            ex.submit(helpers.add, 1)  # queued behind it
            while not os.listdir({str(tmp_path)!r}):
                time.sleep(0.05)
            print("exiting", flush=True)
        """,
        timeout=TIMEOUT,
    )
    assert check(result).strip() == "exiting"
    (worker,) = (int(name) for name in os.listdir(tmp_path))
    psutil = pytest.importorskip("psutil")
    try:
        psutil.Process(worker).wait(TIMEOUT)
    except psutil.NoSuchProcess:
        pass
    assert not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE


# ---- 9. a parent-side OSError is not a worker crash -----------------------------


def test_parent_out_of_fds_fails_the_call_and_leaves_the_worker_alone() -> None:
    out = check(
        run_python(
            """
            import os, resource
            import offload
            from tests import helpers

            if __name__ == "__main__":
                ex = offload.get_executor("process", max_workers=1)
                before = ex.submit(helpers.pid).result(timeout=60)
                lowest_free = os.open(os.devnull, os.O_RDONLY)
                os.close(lowest_free)
                soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
                resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
                try:
                    ex.submit(helpers.identity, b"x" * (1 << 20)).result(timeout=60)
                except Exception as exc:
                    print("error", type(exc).__name__, exc)
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
                print("same worker", ex.submit(helpers.pid).result(timeout=60) == before)
                ex.shutdown()
            """
        )
    )
    assert "error OffloadError" in out, out
    assert "Too many open files" in out
    assert "same worker True" in out


# ---- 10. deep tracebacks keep the exception's type --------------------------------


async def test_deep_traceback_keeps_the_exception_type(executor: offload.Executor) -> None:
    with pytest.raises(ValueError, match="bottom of 0"):
        await executor.run(helpers.recurse_then_raise, 700)
    with pytest.raises(RecursionError):
        await executor.run(helpers.recurse_forever)


# ---- 11. closing a shared executor does not break other functions -----------------


async def test_functions_survive_their_shared_executor_being_shut_down() -> None:
    options = {"strategy": "thread", "max_workers": 3, "thread_name_prefix": "failures-shared"}
    first = offload.make_async(helpers.add, **options)
    second = offload.make_async(helpers.identity, **options)
    assert first.executor is second.executor  # type: ignore[attr-defined]
    first.executor.shutdown()  # type: ignore[attr-defined]
    assert await second("still here") == "still here"
    assert await first(1, 2) == 3
    offload.shutdown_shared_executors()
    assert await first(2, 2) == 4
    assert await second("again") == "again"
    assert first.executor is second.executor  # type: ignore[attr-defined]
    assert not first.executor.closed  # type: ignore[attr-defined]


# ---- minor points ---------------------------------------------------------------------


def test_done_callback_may_shut_down_during_cancel_futures_shutdown() -> None:
    out = check(
        run_python(
            """
            import threading
            import offload
            from tests import helpers

            if __name__ == "__main__":
                for strategy in ("thread", "process", "async-renderer"):
                    options = {"max_workers": 1} if strategy != "async-renderer" else {}
                    ex = offload.get_executor(strategy, **options)
                    running = ex.submit(helpers.sleep_and_return, 0.5)
                    queued = ex.submit(helpers.add, 1)
                    queued.add_done_callback(lambda f, ex=ex: ex.shutdown(wait=False))
                    stopper = threading.Thread(
                        target=ex.shutdown, kwargs={"cancel_futures": True}, daemon=True
                    )
                    stopper.start()
                    stopper.join(30)
                    print(strategy, "stuck" if stopper.is_alive() else "ok", queued.cancelled())
            """
        )
    )
    for strategy in ("thread", "process", "async-renderer"):
        assert f"{strategy} ok True" in out, out


def test_large_bytearray_travels_out_of_band() -> None:
    threshold = _wire.DEFAULT_SHM_THRESHOLD
    _, buffers = _encoding.dumps(_encoding.wrap_bytes(bytearray(1 << 20), threshold), threshold)
    assert len(buffers) == 1


def test_large_bytearray_round_trips_as_bytearray(process_ex: offload.Executor) -> None:
    data = bytearray(os.urandom(1 << 20))
    back = process_ex.submit(helpers.identity, data).result(timeout=TIMEOUT)
    assert type(back) is bytearray
    assert back == data


def test_worker_is_quiet_when_the_parent_goes_away() -> None:
    result = run_python(
        """
        import multiprocessing, pickle, time
        from offload._strategies import _in_worker

        if __name__ == "__main__":
            ctx = multiprocessing.get_context("spawn")
            parent_end, child_end = ctx.Pipe()
            alive_r, alive_w = ctx.Pipe(duplex=False)
            worker = ctx.Process(target=_in_worker.main, args=(child_end, alive_r, None, (), None, None))
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


async def test_initializer_failure_is_offload_error_on_every_strategy(strategy: str) -> None:
    ex = offload.get_executor(strategy, initializer=helpers.fail_init, **small_options(strategy))
    try:
        with pytest.raises(offload.OffloadError, match="initializer") as info:
            await ex.run(helpers.add, 1, 2)
        assert isinstance(info.value.__cause__, RuntimeError) or "initializer broke" in str(info.value)
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("raw", ["1_0", "+4", "\u0664", "0x10", " 1 0 "])
def test_max_workers_env_takes_plain_digits_only(raw: str) -> None:
    with pytest.raises(offload.ConfigError, match="not an integer"):
        max_workers_from_env({"OFFLOAD_MAX_WORKERS": raw})
    assert max_workers_from_env({"OFFLOAD_MAX_WORKERS": " 10 "}) == 10



def test_cancelled_future_dropped_by_shutdown_counts_as_done(strategy: str) -> None:
    # `concurrent.futures.wait` counts a cancelled future only once notified:
    # a queued call whose future was cancelled, then dropped by a shutdown,
    # used to stay "pending" there forever.
    if strategy == "inline":
        pytest.skip("inline runs a call within submit(): nothing queues")
    options = small_options(strategy)
    if has_pool(strategy):
        options["max_workers"] = 1
    ex = offload.get_executor(strategy, **options)
    try:
        running = ex.submit(helpers.sleep_and_return, 0.5)
        queued = [ex.submit(helpers.add, i, 1) for i in range(3)]
        for future in queued:
            assert future.cancel()
        ex.shutdown(wait=False, cancel_futures=True)
        _, pending = concurrent.futures.wait([running, *queued], timeout=TIMEOUT)
        assert not pending
        assert len(list(concurrent.futures.as_completed(queued, timeout=TIMEOUT))) == 3
    finally:
        ex.shutdown(wait=True)
