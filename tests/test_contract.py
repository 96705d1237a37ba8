"""offload's contract suite (`offload.testing.StrategyContract`) against every
registered strategy and the docs' examples (see `conftest.strategies_under_test`)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import pytest

import offload
from docs.examples import pool_strategy
from docs.examples.pool_strategy import _init_worker, _ready
from offload._registry import _registry
from offload.strategy import (
    Call,
    PooledStrategy,
    by_reference,
    count_worker_restart,
    initializer_failed,
    portable_error,
    run_on_each_worker,
)
from offload.testing import StrategyContract

from .conftest import POOL_EXAMPLE, strategies_under_test


class TestContract(StrategyContract):
    @pytest.fixture(params=strategies_under_test())
    def strategy(self, request: pytest.FixtureRequest) -> str:
        return str(request.param)

    def strategy_options(self, strategy: str) -> dict[str, Any]:
        if strategy == "async-renderer":
            # One call at a time unless calls share a batch form: capacity() is the batch size.
            return {"max_batch_size": 1}
        return super().strategy_options(strategy)


@pytest.mark.skipif(
    bool(os.environ.get("OFFLOAD_TEST_STRATEGIES", "").strip()),
    reason="OFFLOAD_TEST_STRATEGIES names the strategies under test",
)
class TestPoolExample(StrategyContract):
    """docs/examples/pool_strategy.py, as its author would check it; on asyncio
    only (a strategy never touches the event loop, and its workers are slow to
    spawn: the other backends are the built-ins' business)."""

    strategy_name = POOL_EXAMPLE

    @pytest.fixture
    def anyio_backend(self) -> Any:
        return ("asyncio", {})


class TestContractWithExpress(StrategyContract):
    """`thread` and `process` with the express worker taking every call of
    the suite's default cost (1): `capacity()` counts it, and every contract
    (cancellation, shutdown, errors, the bound) holds with it."""

    @pytest.fixture(params=[s for s in ("thread", "process") if s in strategies_under_test()])
    def strategy(self, request: pytest.FixtureRequest) -> str:
        return str(request.param)

    def strategy_options(self, strategy: str) -> dict[str, Any]:
        return {**super().strategy_options(strategy), "express_cost": 1}

    @pytest.fixture
    def anyio_backend(self) -> Any:
        # The express slot is the dispatcher's, which never touches the event
        # loop: the backends are the plain suite's business.
        return ("asyncio", {})


_WRONG_STRATEGY = '''
from offload.strategy import Strategy


class WrongAnswer(Strategy):
    """Answers 6 to every call."""

    name = "wrong-answer"

    def schedule(self, call):
        if call.claim():
            call.set_result(6)

    def shutdown(self, wait, cancel_futures):
        pass
'''

_AUTHORS_TEST = '''
from offload.testing import StrategyContract


class TestWrongAnswer(StrategyContract):
    strategy_name = "wrong-answer"
'''


def test_an_outside_authors_run_shows_values_and_leaves_the_folder_clean(tmp_path: Path) -> None:
    """The suite as an outside author runs it (a plugin registered by its
    entry point, pytest started in the plugin's folder with no configuration
    of its own): a failing assertion of the suite shows its values, without
    the author registering assert rewriting, and neither Hypothesis nor
    pytest-benchmark leaves a folder behind there."""
    dist = tmp_path / "wrong_answer-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: wrong-answer\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[offload.strategies]\nwrong-answer = wrong_answer:WrongAnswer\n")
    (tmp_path / "wrong_answer.py").write_text(_WRONG_STRATEGY)
    (tmp_path / "test_wrong.py").write_text(_AUTHORS_TEST)
    env = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_STORAGE_DIRECTORY"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(offload.__file__).parents[1]), str(tmp_path)])
    selected = "asyncio and (test_run_returns_result or test_same_result_as_a_direct_call)"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", selected],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "2 failed" in out, out
    assert "assert 6 == 5" in out, out  # the values, as pytest shows them
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))
    assert left == [], out



# ---- one pool behind every slot ----------------------------------------------------------


def _run(
    initializer: Callable[..., Any] | None, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[bool, Any]:
    # In a worker process: a worker whose initializer failed fails its calls with that.
    error = pool_strategy._init_error
    if error is not None:
        return False, portable_error(initializer_failed(initializer, error))
    return pool_strategy._run(fn, args, kwargs)


class _Joined:
    """A slot of `SharedProcessPool`: it has no worker of its own."""

    def __init__(self) -> None:
        self.joined = False


class _SharedSlots:
    """Every slot sends its calls to the strategy's one pool; the last slot
    out releases it (`SlotWorker.stop_worker`)."""

    def __init__(self, strategy: SharedProcessPool) -> None:
        self._strategy = strategy
        self._lock = threading.Lock()
        self._joined = 0

    def new_slot(self, number: int) -> _Joined:
        return _Joined()

    def start_worker(self, slot: _Joined) -> None:
        with self._lock:
            if not slot.joined:
                slot.joined = True
                self._joined += 1
        self._strategy.pool()

    def worker_ready(self, slot: _Joined) -> bool:
        return slot.joined

    def run(self, slot: _Joined, call: Call[Any]) -> None:
        pool = self._strategy.pool()
        try:
            ok, value = pool.submit(_run, self._strategy.initializer, by_reference(call.fn), call.args, call.kwargs).result()
        except BrokenProcessPool as exc:
            # The calls running in the pool may fail with it: the strategy declares it.
            # Replaced first: a call its caller makes on hearing of the crash must
            # find the new pool, not the broken one.
            self._strategy.replace(pool)
            call.set_exception(offload.WorkerCrashed(f"shared-process-pool: a worker died: {exc}"))
            return
        except BaseException as exc:  # the call or its result could not be pickled
            call.set_exception(exc)
            return
        if ok:
            call.set_result(value)
        else:
            call.set_exception(value)

    def stop_worker(self, slot: _Joined) -> None:
        with self._lock:
            if not slot.joined:
                return
            slot.joined = False
            self._joined -= 1
            last = self._joined == 0
        if last:
            self._strategy.release()


class SharedProcessPool(PooledStrategy[_Joined]):
    """A strategy whose slots all share one `ProcessPoolExecutor` (a crash
    breaks it whole, failing calls running beside it:
    `crash_fails_running_calls`), for the contract suite
    only: its pool starts every worker before its first call
    (`run_on_each_worker`)."""

    name = "shared-process-pool"
    carries_context = False
    replaces_crashed_workers = True
    crash_fails_running_calls = True

    def __init__(
        self,
        max_workers: int | None = None,
        *,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
    ) -> None:
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        super().__init__(max_workers, initializer=initializer, initargs=initargs)

    def new_slot_worker(self) -> _SharedSlots:
        return _SharedSlots(self)

    def pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                pool = ProcessPoolExecutor(
                    self.max_workers,
                    mp_context=multiprocessing.get_context("forkserver"),
                    initializer=_init_worker,
                    initargs=(self.initializer, self.initargs),
                )
                # Every worker up before the first call: a worker the pool
                # starts for a call while its other calls run is missing from
                # what it watches, and its death went unseen until the next
                # result came back (Python 3.11).
                run_on_each_worker(pool, self.max_workers, _ready)
                self._pool = pool
            return self._pool

    def replace(self, broken: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is not broken:
                return  # another slot replaced it
            self._pool = None
        broken.shutdown(wait=False)
        count_worker_restart(self, "crashed")

    def release(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def start(self) -> None:
        super().start()
        for error in run_on_each_worker(self.pool(), self.max_workers, _ready):
            if error is not None:
                raise initializer_failed(self.initializer, error) from error

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._pool = None  # the parent's processes are not the child's
        super().after_fork_in_child()


_registry._sources.setdefault(SharedProcessPool.name, f"{__name__}:SharedProcessPool")


@pytest.mark.skipif(
    bool(os.environ.get("OFFLOAD_TEST_STRATEGIES", "").strip()) or "forkserver" not in multiprocessing.get_all_start_methods(),
    reason="OFFLOAD_TEST_STRATEGIES names the strategies under test, or no forkserver here",
)
class TestSharedPool(StrategyContract):
    """One pool behind every slot, a crash in it failing the calls running
    beside it (`crash_fails_running_calls`): the contract holds for that shape too.
    On asyncio only, as `TestPoolExample`."""

    strategy_name = SharedProcessPool.name

    @pytest.fixture
    def anyio_backend(self) -> Any:
        return ("asyncio", {})
