"""Failure paths of the `ray` strategy, each injected for real.

These run in fresh interpreters, as a new user's program would: no fixture
starts Ray for them, and a regression (a hang, a dead GCS) fails the test
instead of the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

#: Starting a local Ray takes 10-40 s on a busy two-core machine; twice here.
TIMEOUT = 420


def run_python(code: str, timeout: float = TIMEOUT) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH", "")]))
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=timeout, env=env, check=False,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, f"exit {result.returncode}\n{out}"
    return out


@pytest.mark.timeout(TIMEOUT + 30)
def test_an_executor_that_started_ray_itself_survives_its_own_shutdown() -> None:
    # The path a new user takes: no ray.init of their own, several executors
    # one after another. Ray ties the local GCS and raylet it starts to the
    # *thread* that started them; the slot thread that used to start them
    # exited at shutdown and took them down, and with them the program.
    out = run_python(
        """
        import os
        import ray_settings  # loopback only, before ray
        import offload

        for attempt in range(3):
            ex = offload.get_executor("ray", max_workers=1, num_cpus=0.5, address="local",
                                      ray_init_options={**ray_settings.LOCAL_RAY_OPTIONS, "num_cpus": 2})
            print("call", attempt, ex.submit(os.getpid).result(timeout=300) > 0, flush=True)
            ex.shutdown(wait=True)
        print("done", flush=True)
        """
    )
    assert "call 2 True" in out, out
    assert "done" in out, out
    assert "Failed to connect to GCS" not in out, out


@pytest.mark.timeout(TIMEOUT + 30)
def test_aclose_timeout_stops_an_actor_still_starting(tmp_path: Path) -> None:
    out = run_python(
        f"""
        import os, time
        import anyio
        import ray_settings
        import ray
        import offload
        from offload_ray import RayStrategy

        STARTED = {str(tmp_path / "started")!r}

        def slow_init():
            open(STARTED, "w").close()
            time.sleep(120)

        async def main():
            ray.init(**ray_settings.LOCAL_RAY)
            ex = offload.Executor(RayStrategy(1, initializer=slow_init, num_cpus=0.5))
            future = ex.submit(time.time)
            with anyio.fail_after(120):  # the actor is created, its initializer sleeping
                while not os.path.exists(STARTED):
                    await anyio.sleep(0.02)
            began = time.monotonic()
            await ex.aclose(timeout=0.5)
            print("aclose took", round(time.monotonic() - began, 1), flush=True)
            try:
                future.result(timeout=60)
            except BaseException as exc:
                print("call ended with", type(exc).__name__, flush=True)
            ray.shutdown()

        anyio.run(main)
        """
    )
    took = float(out.split("aclose took ")[1].split()[0])
    assert took < 30, out  # the initializer sleeps 120 s
    assert "call ended with" in out, out


@pytest.mark.timeout(TIMEOUT + 30)
def test_a_forked_child_is_told_ray_did_not_come_with_it() -> None:
    out = run_python(
        """
        import os, signal
        import ray_settings
        import ray
        import offload

        ray.init(**ray_settings.LOCAL_RAY)
        ex = offload.get_executor("ray", max_workers=1, num_cpus=0.5)
        assert ex.submit(os.getpid).result(timeout=300) > 0
        pid = os.fork()
        if pid == 0:
            signal.alarm(60)
            code = 1
            try:
                child = offload.get_executor("ray", max_workers=1, num_cpus=0.5)
                child.submit(os.getpid).result(timeout=30)
                print("child ran a call", flush=True)
            except offload.OffloadError as exc:
                print("child told:", exc, flush=True)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print("child exit", os.waitstatus_to_exitcode(status), flush=True)
        print("parent still works", ex.submit(os.getpid).result(timeout=60) > 0, flush=True)
        ex.shutdown()
        ray.shutdown()
        """
    )
    assert "child told:" in out, out
    assert "os.fork()" in out, out
    assert "child exit 0" in out, out
    assert "parent still works True" in out, out


#: Rounds of calls then `shutdown(wait=True)` without `start()`: before the
#: fix about one in three returned with a CPU still taken, so 15 rounds
#: miss it with a chance of about 1 in 400. Each takes about a second.
RELEASE_ROUNDS = 15


@pytest.mark.timeout(TIMEOUT + 30)
def test_shutdown_with_wait_returns_once_the_actors_resources_are_back() -> None:
    # Every CPU of the local Ray held by the pool's actors: `shutdown(wait=True)`
    # used to return as soon as it had asked Ray to kill them, while the
    # cluster still counted their CPUs as taken, so the next executor's actors
    # had nowhere to go. Then rounds without `start()`: the calls run on the
    # first actor up, and shutdown begins while the other is still starting,
    # its CPU already taken; shutdown counted only the actors that had
    # answered by then, and returned with one CPU of two still taken.
    out = run_python(
        f"""
        import os, time
        import ray_settings
        import ray
        import offload
        from offload_ray import RayStrategy

        options = {{**ray_settings.LOCAL_RAY_OPTIONS, "num_cpus": 2}}
        for attempt in range(3):
            ex = offload.Executor(RayStrategy(2, address="local", ray_init_options=options, actor_start_timeout=120))
            ex.start()  # both actors placed; fails if one is not within 120 s
            held_by_then = time.monotonic() + 120
            while ray.available_resources().get("CPU", 0.0) > 0 and time.monotonic() < held_by_then:
                time.sleep(0.05)
            print("free while running", attempt, ray.available_resources().get("CPU", 0.0), flush=True)
            ex.shutdown(wait=True)
            print("free after shutdown", attempt, ray.available_resources().get("CPU", 0.0), flush=True)
        for attempt in range({RELEASE_ROUNDS}):
            ex = offload.Executor(RayStrategy(2, actor_start_timeout=120))
            calls = [ex.submit(os.getpid) for _ in range(4)]
            assert all(call.result(timeout=120) > 0 for call in calls)
            ex.shutdown(wait=True)
            print("free after calls", attempt, ray.available_resources().get("CPU", 0.0), flush=True)
        print("done", flush=True)
        """
    )
    for attempt in range(3):
        assert f"free while running {attempt} 0.0" in out, out
        assert f"free after shutdown {attempt} 2.0" in out, out
    for attempt in range(RELEASE_ROUNDS):
        assert f"free after calls {attempt} 2.0" in out, out
    assert "done" in out, out


@pytest.mark.timeout(TIMEOUT + 30)
def test_a_process_that_forked_keeps_using_ray() -> None:
    # Three times: a child tries the inherited executor, is told it cannot,
    # and collects its garbage (as any child that runs a while does); the
    # parent's calls, a new executor's actors and shutdown(wait=True) must
    # all still work. The child's collector used to finalize the Ray objects
    # it inherited, whose finalizers spoke on the parent's connections: with
    # Ray 2.60 no new actor started in the parent after the second fork, its
    # GCS stopped answering, or Ray aborted it.
    out = run_python(
        """
        import gc, os, signal, sys, time, traceback
        import ray_settings
        import ray
        import offload

        try:
            ray.init(**ray_settings.LOCAL_RAY)
            for round_ in range(3):
                ex = offload.get_executor("ray", max_workers=2, num_cpus=0.5, actor_start_timeout=60)
                assert ex.submit(os.getpid).result(timeout=90) > 0
                pid = os.fork()
                if pid == 0:
                    signal.alarm(60)
                    try:
                        ex.submit(os.getpid).result(timeout=30)
                    except offload.OffloadError as exc:
                        print("child told", round_, exc, flush=True)
                    gc.collect()
                    os._exit(0)
                os.waitpid(pid, 0)
                assert ex.submit(os.getpid).result(timeout=60) > 0
                started = time.monotonic()
                ex.shutdown(wait=True)
                print("shutdown", round_, "took", round(time.monotonic() - started, 2), flush=True)
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)  # ray.shutdown() at exit would wait on a GCS that may not answer
        os._exit(0)
        """
    )
    for round_ in range(3):
        assert f"child told {round_} ray strategy: this process was forked" in out, out
        took = float(out.split(f"shutdown {round_} took ")[1].split()[0])
        assert took < 30, out


@pytest.mark.timeout(TIMEOUT + 30)
def test_shutdown_with_wait_returns_when_rays_gcs_stops_answering() -> None:
    # Ray's calls through its GCS have no timeout of their own: with the GCS
    # stopped (SIGSTOP: its connections stay open and nothing answers), the
    # resource query in shutdown(wait=True) never returned.
    out = run_python(
        """
        import os, sys, time, traceback
        import psutil
        import ray_settings
        import ray
        import offload
        from offload_ray import RayStrategy

        try:
            ray.init(**ray_settings.LOCAL_RAY)
            # A short bound: the GCS never answers, so shutdown waits all of it.
            ex = offload.Executor(RayStrategy(2, num_cpus=0.5, actor_stop_timeout=1))
            ex.start()  # every actor placed: none is starting (placing one needs the GCS)
            assert ex.submit(os.getpid).result(timeout=300) > 0
            (gcs,) = [p for p in psutil.Process().children(recursive=True) if p.name() == "gcs_server"]
            gcs.suspend()
            try:
                started = time.monotonic()
                ex.shutdown(wait=True)
                print("shutdown took", round(time.monotonic() - started, 2), flush=True)
            finally:
                gcs.resume()
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)  # ray.shutdown() at exit would wait on the GCS
        os._exit(0)
        """,
        timeout=180,
    )
    took = float(out.split("shutdown took ")[1].split()[0])
    assert took < 30, out  # without the bound: never (the script's timeout)
    assert "ray strategy: shutdown waited 1 s" in out, out  # and says it stopped waiting
