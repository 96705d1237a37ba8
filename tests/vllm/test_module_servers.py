"""Modules' own servers (`_module_servers`): started several modules at a time,
within `AT_ONCE`, each module's stopped when it ends, the rest before the
shared servers. Stand-in servers (test_shm_left's: a process answering
`/health` on loopback), no vLLM."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from . import _module_servers
from ._module_servers import AT_ONCE, ModuleServers, register
from ._server import Server
from .test_shm_left import stand_in


@pytest.fixture
def modules(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, list[Server]]:
    """Three registered modules of `AT_ONCE - 4`, 4 and 2 servers (the first
    two fit together, the third does not), and one that needs a strategy
    this run lacks: every server each one started."""
    monkeypatch.setattr(_module_servers, "_REGISTERED", {})
    made: dict[str, list[Server]] = {}

    def module(name: str, servers: int, needs: tuple[str, ...] = ()) -> None:
        @register(name, needs=needs, servers=servers)
        def starts(model_dirs: Mapping[str, Path], log_dir: Path) -> dict[str, Callable[[], Server]]:
            def start() -> Server:
                (log_dir / str(len(made[name]))).mkdir()
                server = stand_in(log_dir / str(len(made[name])), "cleans-up")
                made[name].append(server)
                return server

            return {f"{name}-{i}": start for i in range(servers)}

        made[name] = []

    module("first", AT_ONCE - 4)
    module("second", 4)
    module("third", 2)
    module("elsewhere", 1, needs=("ray",))
    return made


def pool(tmp_path: Path) -> ModuleServers:
    order = ["first", "unregistered", "elsewhere", "second", "third"]
    return ModuleServers({}, tmp_path, order, available=("thread",))


def test_modules_start_together_within_the_bound_and_stop_with_their_module(
    modules: dict[str, list[Server]], tmp_path: Path
) -> None:
    servers = pool(tmp_path)
    with servers.taken("first") as first:
        assert len(first) == AT_ONCE - 4
        # The next module's servers started with these; the third's would pass the bound.
        assert [len(modules[m]) for m in ("first", "second", "third", "elsewhere")] == [AT_ONCE - 4, 4, 0, 0]
        assert all(s.alive() for m in ("first", "second") for s in modules[m])
    assert not any(s.alive() for s in modules["first"])
    with servers.taken("second") as second:
        assert sorted(second) == [f"second-{i}" for i in range(4)]
        assert [len(modules[m]) for m in ("second", "third")] == [4, 0]  # started already, not again
    with servers.taken("third"):
        assert all(s.alive() for s in modules["third"])
    assert not any(s.alive() for m in modules for s in modules[m])


def test_close_stops_the_servers_of_modules_that_never_took_them(
    modules: dict[str, list[Server]], tmp_path: Path
) -> None:
    servers = pool(tmp_path)
    with servers.taken("first"):
        pass
    assert all(s.alive() for s in modules["second"])
    servers.close()
    assert not any(s.alive() for s in modules["second"])
    with pytest.raises(AssertionError, match="shared servers are up"), servers.taken("third"):
        pass
    assert modules["third"] == []


def test_a_module_that_needs_a_missing_strategy_starts_only_when_it_asks(
    modules: dict[str, list[Server]], tmp_path: Path
) -> None:
    servers = pool(tmp_path)
    with servers.taken("first"):
        assert modules["elsewhere"] == []
    with servers.taken("elsewhere") as elsewhere:
        assert len(elsewhere) == 1
    servers.close()
    assert not any(s.alive() for m in modules for s in modules[m])
