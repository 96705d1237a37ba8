"""Strategy selection: argument > environment > default, and clear errors for bad values."""

from __future__ import annotations

import os
import sys
import textwrap
import threading
from pathlib import Path

import anyio
import pytest

import offload
import offload.strategy
from offload._config import max_workers_from_env
from offload._registry import _Registry, option_names

from . import helpers


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OFFLOAD_STRATEGY", raising=False)
    monkeypatch.delenv("OFFLOAD_MAX_WORKERS", raising=False)


def test_default_is_thread() -> None:
    with offload.get_executor() as ex:
        assert ex.name == "thread"


def test_environment_selects_strategy_and_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFLOAD_STRATEGY", "inline")
    with offload.get_executor() as ex:
        assert ex.name == "inline"  # OFFLOAD_MAX_WORKERS is ignored by strategies without workers
    monkeypatch.setenv("OFFLOAD_STRATEGY", "thread")
    monkeypatch.setenv("OFFLOAD_MAX_WORKERS", "3")
    with offload.get_executor() as ex:
        assert ex.capacity == 3


def test_arguments_beat_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFLOAD_STRATEGY", "inline")
    monkeypatch.setenv("OFFLOAD_MAX_WORKERS", "3")
    with offload.get_executor("thread", max_workers=5) as ex:
        assert ex.name == "thread"
        assert ex.capacity == 5


def test_unknown_strategy_names_the_valid_ones() -> None:
    with pytest.raises(offload.ConfigError, match=r"'threads'.*'inline'.*'thread'"):
        offload.get_executor("threads")


def test_unknown_strategy_from_env_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFLOAD_STRATEGY", "gpu")
    with pytest.raises(offload.ConfigError, match=r"OFFLOAD_STRATEGY.*'gpu'"):
        offload.get_executor()


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_bad_worker_count(bad: object) -> None:
    with pytest.raises(offload.ConfigError, match="max_workers"):
        offload.get_executor("thread", max_workers=bad)


@pytest.mark.parametrize("raw", ["0", "-2", "many", "1.5"])
def test_bad_worker_count_from_env(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("OFFLOAD_MAX_WORKERS", raw)
    with pytest.raises(offload.ConfigError, match="OFFLOAD_MAX_WORKERS"):
        offload.get_executor("thread")


def test_unknown_option_lists_the_strategy_options() -> None:
    with pytest.raises(offload.ConfigError, match=r"'max_workers'.*initializer"):
        offload.get_executor("inline", max_workers=2)
    with pytest.raises(offload.ConfigError, match=r"'workers'.*max_workers"):
        offload.get_executor("thread", workers=2)


def test_bad_initializer() -> None:
    with pytest.raises(offload.ConfigError, match="initializer"):
        offload.get_executor("thread", initializer=42)
    with pytest.raises(offload.ConfigError, match="initargs"):
        offload.get_executor("thread", initializer=helpers.make_state, initargs=["x"])


def _install_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str) -> None:
    """A real installed distribution (dist-info on sys.path) declaring an entry point."""
    (tmp_path / "offload_plugin_demo.py").write_text(
        textwrap.dedent(
            """
            from typing import final

            from offload.strategy import Strategy, executor_closed

            class NotAStrategy:
                pass

            @final
            class Demo(Strategy):
                name = "demo"

                def __init__(self) -> None:
                    self._closed = False

                def schedule(self, call):
                    if self._closed:
                        raise executor_closed(self.name)
                    if call.claim():
                        call.execute()

                def shutdown(self, wait, cancel_futures):
                    self._closed = True

            class Misnamed(Strategy):
                name = "something-else"
                schedule = Demo.schedule
                shutdown = Demo.shutdown

            class Unfinished(Strategy):
                name = "demo"

                def shutdown(self, wait, cancel_futures):
                    pass

            class Greedy(Strategy):
                name = "demo"
                schedule = Demo.schedule
                shutdown = Demo.shutdown

                def __init__(self, max_queue=None):
                    pass
            """
        )
    )
    dist = tmp_path / "offload_plugin_demo-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: offload-plugin-demo\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        f"[offload.strategies]\ndemo = {target}\nthread = offload_plugin_demo:Demo\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "offload_plugin_demo", raising=False)


async def _roundtrip(ex: offload.Executor) -> int:
    return await ex.run(helpers.add, 20, 22)


def test_entry_point_strategy_is_discovered_and_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import anyio

    _install_plugin(tmp_path, monkeypatch, "offload_plugin_demo:Demo")
    registry = _Registry()
    assert "demo" in registry.names()
    assert registry.names().count("thread") == 1
    ex = offload.Executor(registry.get("demo")())
    try:
        assert anyio.run(_roundtrip, ex) == 42
    finally:
        ex.shutdown()


def test_a_plugin_under_a_builtins_name_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The distribution also registers `thread = offload_plugin_demo:Demo`: using
    # the name must not silently run the built-in in the plugin's place.
    _install_plugin(tmp_path, monkeypatch, "offload_plugin_demo:Demo")
    registry = _Registry()
    assert registry.names().count("thread") == 1
    with pytest.raises(
        offload.ConfigError,
        match=r"plugin 'thread' \('offload_plugin_demo:Demo'\) is registered under the name of the built-in",
    ):
        registry.get("thread")
    assert registry.get("inline").__module__ == "offload._strategies._inline"  # the others are unaffected


def test_bad_entry_point_fails_loudly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install_plugin(tmp_path, monkeypatch, "offload_plugin_demo:NotAStrategy")
    with pytest.raises(offload.ConfigError, match=r"'demo'.*not a subclass of offload.strategy.Strategy"):
        _Registry().get("demo")


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("Misnamed", r"'demo'.*Misnamed.name is 'something-else', but it is registered as 'demo'"),
        ("Unfinished", r"'demo'.*abstract: Unfinished does not implement schedule"),
        ("Greedy", r"'demo'.*Greedy takes 'max_queue', which the executor owns"),
    ],
)
def test_plugin_is_checked_when_it_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, expected: str
) -> None:
    _install_plugin(tmp_path, monkeypatch, f"offload_plugin_demo:{target}")
    with pytest.raises(offload.ConfigError, match=expected):
        _Registry().get("demo")


def test_broken_entry_point_fails_loudly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install_plugin(tmp_path, monkeypatch, "offload_plugin_missing:Nothing")
    with pytest.raises(offload.ConfigError, match=r"'demo'.*failed to load"):
        _Registry().get("demo")


@pytest.mark.parametrize("raw", ["1_0", "+4", "\u0664", "0x10", " 1 0 "])
def test_max_workers_env_takes_plain_digits_only(raw: str) -> None:
    with pytest.raises(offload.ConfigError, match="not an integer"):
        max_workers_from_env({"OFFLOAD_MAX_WORKERS": raw})
    assert max_workers_from_env({"OFFLOAD_MAX_WORKERS": " 10 "}) == 10


@pytest.mark.parametrize("builtin", offload.strategy.BUILTIN_STRATEGIES, ids=lambda b: b.name)
def test_the_builtin_table_says_what_each_strategy_is(builtin: offload.strategy.BuiltinStrategy) -> None:
    assert offload.STRATEGIES[: len(offload.strategy.BUILTIN_STRATEGIES)] == tuple(
        b.name for b in offload.strategy.BUILTIN_STRATEGIES
    )
    cls = _Registry().get(builtin.name)
    assert cls.name == builtin.name
    options = set(option_names(cls))
    assert ("max_workers" in options) == builtin.pool
    assert ({"express_cost", "nice"} <= options) == builtin.express
    assert builtin.express or not {"express_cost", "nice"} & options
    assert ("max_batch_size" in options) == builtin.batches
    with offload.get_executor(builtin.name) as ex:
        pid, thread = anyio.run(ex.run, helpers.worker_identity)
    if pid != os.getpid():
        assert builtin.runs_in == "processes"
    else:
        assert builtin.runs_in == ("caller" if thread == threading.get_ident() else "threads")
