"""Fork safety (`_fork`): a child made by `os.fork()` gets working executors,
whatever its parent did before the fork (used an executor, had calls in
flight, started a forkserver, was inside the resource tracker, held a
metric's lock).

Each scenario runs in a fresh interpreter with a timeout (and an alarm in the
forked child), so a regression fails instead of hanging the suite."""

from __future__ import annotations

import pytest

import offload

from .helpers import TIMEOUT
from .in_subprocess import check, run_python


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
            import os, tempfile, time
            import offload
            from tests import helpers

            if __name__ == "__main__":
                for strategy in ("thread", "process", "async-renderer"):
                    options = {"max_workers": 1} if strategy != "async-renderer" else {"max_batch_size": 1}
                    ex = offload.get_executor(strategy, max_queue=0, **options)
                    # Held until the child is done, however long it takes.
                    gate = os.path.join(tempfile.mkdtemp(), "gate")
                    busy = ex.submit(helpers.wait_for_file, gate)
                    deadline = time.monotonic() + 30
                    while not ex.overloaded and time.monotonic() < deadline:
                        time.sleep(0.01)
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
                    open(gate, "w").close()
                    print(strategy, "child", os.waitstatus_to_exitcode(status), busy.result(timeout=30))
                    ex.shutdown()
            """,
            timeout=4 * TIMEOUT,
        )
    )
    for strategy in ("thread", "process", "async-renderer"):
        assert f"{strategy} child 0 released" in out, out


def test_a_child_forked_while_a_worker_start_was_inside_the_resource_tracker_can_start_workers() -> None:
    # A slot thread starting a worker passes through multiprocessing's
    # resource tracker, under its lock; a fork at that moment (seen under
    # load, with calls just submitted) left the lock held in the child, whose
    # first new thread got the parent's slot thread's id back: its worker start
    # failed with `ReentrantCallError` (or hung, with another id).
    out = check(
        run_python(
            """
            import os, threading
            from multiprocessing import resource_tracker
            import offload
            from tests import helpers

            if __name__ == "__main__":
                tracker = resource_tracker._resource_tracker
                parent = os.getpid()
                inside, release = threading.Event(), threading.Event()
                probe = tracker._check_alive

                def held_probe():
                    # Called by `ensure_running` with the tracker's lock held.
                    if os.getpid() == parent and threading.current_thread() is not threading.main_thread():
                        inside.set()
                        release.wait(60)
                    return probe()

                resource_tracker.ensure_running()  # so the slot's start probes it
                tracker._check_alive = held_probe
                ex = offload.get_executor("process", max_workers=1)
                busy = ex.submit(helpers.add, 1, 1)
                assert inside.wait(60), "the slot thread never reached the tracker"
                pid = helpers.fork_a_child_that_calls(ex)
                release.set()
                _, status = os.waitpid(pid, 0)
                print("child exit", os.waitstatus_to_exitcode(status), "parent got", busy.result(60), flush=True)
                ex.shutdown()
            """,
            timeout=2 * TIMEOUT,
        )
    )
    assert "child got 42" in out, out
    assert "child exit 0 parent got 2" in out, out


FORK_AFTER_FORKSERVER = """
import gc, multiprocessing, os, signal, sys, threading
how = sys.argv[1]
if how != "offload-imported-late":
    import offload
from tests import helpers

if __name__ == "__main__":
    if how == "executor-used-and-gone":
        ex = offload.get_executor("process", max_workers=1)
        assert ex.submit(helpers.add, 1, 2).result(60) == 3
        ex.shutdown()
        del ex
        gc.collect()
    elif how in ("plain-multiprocessing", "offload-imported-late"):
        process = multiprocessing.get_context("forkserver").Process(target=helpers.add, args=(1,))
        process.start()
        process.join()
    elif how == "forkserver-lock-held":
        # As if another thread were starting the forkserver at the fork.
        from multiprocessing import forkserver
        forkserver._forkserver._lock.acquire()
    pid = os.fork()
    if pid == 0:
        signal.alarm(60)  # a hung child must not outlive the test
        code = 1
        try:
            import offload
            ex = offload.get_executor("process", max_workers=1)
            print("child got", ex.submit(helpers.add, 20, 22).result(60), flush=True)
            ex.shutdown()
            code = 0
        except BaseException as exc:
            print("child failed:", repr(exc), flush=True)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print("child exit", os.waitstatus_to_exitcode(status), flush=True)
"""


@pytest.mark.parametrize(
    "how",
    ["executor-used-and-gone", "plain-multiprocessing", "forkserver-lock-held", "offload-imported-late"],
)
def test_a_process_executor_made_in_a_forked_child_works_whatever_the_parent_did(how: str) -> None:
    out = check(run_python(FORK_AFTER_FORKSERVER.replace("sys.argv[1]", repr(how)), timeout=120))
    assert "child got 42" in out, out
    assert "child exit 0" in out, out


def test_a_child_forked_while_a_metric_lock_was_held_can_count() -> None:
    pytest.importorskip("prometheus_client")
    out = check(
        run_python(
            """
            import os
            import offload
            from offload import _metrics
            from tests import helpers

            if __name__ == "__main__":
                ex = offload.get_executor("thread", max_workers=1)
                assert ex.submit(helpers.add, 1, 2).result(60) == 3
                families = _metrics._Families.get()
                # A worker of the parent counting a call at the fork holds this lock.
                child = families.queued.labels("thread", _metrics.function_label(helpers.add))
                child._value._lock.acquire()
                pid = helpers.fork_a_child_that_calls(ex)
                child._value._lock.release()
                _, status = os.waitpid(pid, 0)
                print("child exit", os.waitstatus_to_exitcode(status), flush=True)
                ex.shutdown()
            """
        )
    )
    assert "child got 42" in out, out
    assert "child exit 0" in out, out


@pytest.mark.parametrize("lock", ["_call._state_lock", "_decorator._shared_lock"])
def test_a_child_forked_while_a_module_lock_was_held_can_call(lock: str) -> None:
    # Every call's state lock and the shared executors' lock: a thread of the
    # parent holding one at the fork would leave the child's copy held forever.
    module, name = lock.split(".")
    out = check(
        run_python(
            f"""
            import os
            import offload
            from offload import {module} as module
            from tests import helpers

            add = offload.make_async(helpers.add, strategy="thread")

            if __name__ == "__main__":
                ex = offload.get_executor("thread", max_workers=1)
                assert ex.submit(helpers.add, 1, 2).result(60) == 3
                held = getattr(module, {name!r})
                held.acquire()
                pid = os.fork()
                if pid == 0:
                    import anyio, signal, sys
                    signal.alarm(60)
                    code = 1
                    try:
                        got = ex.submit(helpers.add, 20, 22).result(30)
                        # The shared executor made anew, under its lock.
                        offload.shutdown_shared_executors()
                        shared = anyio.run(add, 1, 1)
                        sys.stdout.write(f"child got {{got}} and {{shared}}\\n")
                        code = 0
                    except BaseException as exc:
                        sys.stdout.write(f"child failed: {{exc!r}}\\n")
                    finally:
                        sys.stdout.flush()
                        os._exit(code)
                held.release()
                _, status = os.waitpid(pid, 0)
                print("child exit", os.waitstatus_to_exitcode(status), flush=True)
                ex.shutdown()
                offload.shutdown_shared_executors()
            """
        )
    )
    assert "child got 42 and 2" in out, out
    assert "child exit 0" in out, out
