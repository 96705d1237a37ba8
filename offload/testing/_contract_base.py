"""The contract suite's shared parts: the backends, value generators, probes
of metrics and state, and `_ContractBase` (fixtures and skips every part uses)."""

from __future__ import annotations

import contextvars
import importlib.util
import math
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, cast

import anyio
import anyio.lowlevel
import pytest

import offload

from .._registry import _registry, option_names
from . import _functions as f


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: set to None in sys.modules (blocked)
        return False


_HAS = {name: _installed(name) for name in ("trio", "uvloop", "hypothesis")}

#: Where the suite keeps what its tools store between runs (Hypothesis's
#: examples and caches), unless the author chose a place: out of the folder
#: pytest runs in, which is the author's.
_STORAGE = Path(tempfile.gettempdir()) / f"offload-testing-{getattr(os, 'getuid', lambda: 'user')()}"


def _store_hypothesis_outside() -> None:
    """Hypothesis keeps its examples and caches in `.hypothesis/` of the
    current folder unless `HYPOTHESIS_STORAGE_DIRECTORY` or
    `hypothesis.configuration.set_hypothesis_home_dir` says otherwise; with
    neither, the suite's own folder under `_STORAGE`. A database set in a
    settings profile is the author's, and stays."""
    if os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        return
    from hypothesis import configuration

    home: Any = configuration.storage_directory(intent_to_write=False)
    # A `StorageDirectory` in recent versions, a `Path` before.
    if Path(getattr(home, "path", home)) == Path.cwd() / ".hypothesis":
        configuration.set_hypothesis_home_dir(_STORAGE / "hypothesis")


if _HAS["hypothesis"]:
    _store_hypothesis_outside()

#: The event loops the suite runs on: asyncio always, uvloop and trio where installed.
BACKENDS = [
    pytest.param(("asyncio", {}), id="asyncio"),
    *([pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")] if _HAS["uvloop"] else []),
    *([pytest.param(("trio", {}), id="trio")] if _HAS["trio"] else []),
]
_BACKEND_NAMES = ["asyncio", *(["trio"] if _HAS["trio"] else [])]

# Values of every kind pickle carries (a strategy may send them to another process).
_EXAMPLES: list[tuple[list[Any], dict[str, Any]]] = [
    ([], {}),
    ([None, True, 0, -(2**70), 1.5, "", "é", b"\x00\xff"], {}),
    ([[1, [2, (3, None)]], (1, "x")], {"a": {"k": [b"v", -0.0]}, "b": ()}),
    ([{"": {"nested": (True, 2.5e300)}}], {"c": "text" * 5}),
]
_MESSAGES = ["boom", "", "multi\nline é"]


def _with_values(test: Callable[..., None]) -> Callable[..., None]:
    """Drive `test(..., args, kwargs)` with Hypothesis where it is installed,
    else with a fixed set of examples."""
    if _HAS["hypothesis"]:
        from hypothesis import HealthCheck, given, settings
        from hypothesis import strategies as st

        scalars: Any = st.none() | st.booleans() | st.integers() | st.text(max_size=20) | st.binary(max_size=32)
        scalars |= st.floats(allow_nan=False)
        values = st.recursive(
            scalars,
            lambda inner: st.lists(inner, max_size=4)
            | st.tuples(inner, inner)
            | st.dictionaries(st.text(max_size=5), inner, max_size=4),
            max_leaves=12,
        )
        driven: Any = settings(
            max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
        )(
            given(
                args=st.lists(values, max_size=3),
                kwargs=st.dictionaries(st.sampled_from("abc"), values, max_size=3),
            )(test)
        )
        return cast("Callable[..., None]", driven)
    marked: Callable[..., None] = pytest.mark.parametrize(("args", "kwargs"), _EXAMPLES)(test)
    return marked


def _with_messages(test: Callable[..., None]) -> Callable[..., None]:
    if _HAS["hypothesis"]:
        from hypothesis import HealthCheck, given, settings
        from hypothesis import strategies as st

        driven: Any = settings(
            max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
        )(given(message=st.text(max_size=40))(test))
        return cast("Callable[..., None]", driven)
    marked: Callable[..., None] = pytest.mark.parametrize("message", _MESSAGES)(test)
    return marked


def _normalise(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, *(_normalise(v) for v in value)]
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items()}
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


def _sample(name: str, **labels: str) -> float | None:
    """A Prometheus sample, or `None` when metrics are off (no `prometheus_client`)."""
    from offload._metrics import metrics_enabled

    if not metrics_enabled():
        return None
    import prometheus_client

    return prometheus_client.REGISTRY.get_sample_value(name, labels) or 0.0


def _inflight(ex: offload.Executor) -> int:
    """Calls admitted and not yet ended (running, queued, or holding an admitted place)."""
    return ex.in_flight


def _overloaded(ex: offload.Executor) -> bool:
    # A call, not the property: its value changes between two reads.
    return ex.overloaded


async def _wait_until(predicate: Callable[[], bool], seconds: float = 30.0) -> None:
    with anyio.fail_after(seconds):
        while not predicate():  # noqa: ASYNC110 (a state other threads and processes change)
            await anyio.sleep(0.005)


def _markers(path: Path) -> int:
    return path.read_text().count("ran") if path.exists() else 0


def _order(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()]


async def _peak_concurrency(ex: offload.Executor, directory: Path, calls: int, hold: float) -> int:
    seen: list[int] = []

    async def one() -> None:
        seen.append(await ex.run(f.hold_slot, str(directory), hold))

    async with anyio.create_task_group() as tg:
        for _ in range(calls):
            tg.start_soon(one)
    return max(seen)


_var: contextvars.ContextVar[str] = contextvars.ContextVar("offload_testing_var", default="unset")


def _read_var() -> str:
    value = _var.get()
    _var.set("changed-in-worker")
    return value


def _where() -> tuple[int, int]:
    return os.getpid(), threading.get_ident()


class _ContractBase:
    """What every part of the contract suite shares: the strategy under test,
    its executors, and the skips by what a strategy declares or does."""

    #: The registered name of the strategy under test.
    strategy_name: ClassVar[str]

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.anyio]

    @pytest.fixture(scope="session", autouse=True)
    @classmethod
    def _no_benchmarks_folder(cls, request: pytest.FixtureRequest) -> Iterator[None]:
        """pytest-benchmark, where installed, makes `.benchmarks/` in the
        folder pytest runs in at start-up, whether a benchmark runs or not;
        the suite runs none: an empty one it made at its default place
        (`--benchmark-storage` not given) is removed at the end."""
        yield
        config = request.config
        if not config.pluginmanager.hasplugin("benchmark"):
            return
        if config.getoption("benchmark_storage", None) != "file://./.benchmarks":
            return  # the author's choice
        folder = config.invocation_params.dir / ".benchmarks"
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()

    @pytest.fixture(params=BACKENDS)
    def anyio_backend(self, request: pytest.FixtureRequest) -> Any:
        return request.param

    @pytest.fixture
    def strategy(self) -> str:
        """The strategy under test (override to parametrize over several)."""
        return self.strategy_name

    def strategy_options(self, strategy: str) -> dict[str, Any]:
        """Options for every executor the suite builds, such that `capacity()`
        calls of a plain function run at once. Default: `max_workers=2` if the
        strategy takes `max_workers`, else none; override to add your own."""
        return {"max_workers": 2} if self._takes(strategy, "max_workers") else {}

    @staticmethod
    def _takes(strategy: str, option: str) -> bool:
        return option in option_names(_registry.get(strategy))

    def new_executor(self, strategy: str, **extra: Any) -> offload.Executor:
        """An executor for `strategy` with `strategy_options` and `extra`
        (`max_workers` in `extra` is dropped for a strategy without it)."""
        options = self.strategy_options(strategy)
        for key, value in extra.items():
            if key == "max_workers" and not self._takes(strategy, key):
                continue
            options[key] = value
        return offload.get_executor(strategy, **options)

    @pytest.fixture
    def executor(self, strategy: str) -> Iterator[offload.Executor]:
        ex = self.new_executor(strategy)
        try:
            yield ex
        finally:
            ex.shutdown(wait=True, cancel_futures=True)

    @pytest.fixture
    def sync_executor(self, executor: offload.Executor) -> offload.Executor:
        """`executor`, for the tests that run their own event loops."""
        return executor

    @staticmethod
    def _needs_queue(ex: offload.Executor) -> int:
        if ex.capacity is None:
            pytest.skip(f"{ex.name} has no queue (capacity() is None): every call starts at once")
        return ex.capacity

    @staticmethod
    async def _skip_if_on_callers_thread(ex: offload.Executor) -> None:
        if await ex.run(_where) == _where():
            pytest.skip(f"{ex.name} runs calls on the caller's thread: nothing can stop one mid-call")

    def _queues(self, strategy: str) -> bool:
        probe = self.new_executor(strategy)
        try:
            return probe.capacity is not None
        finally:
            probe.shutdown()
