"""Servers that belong to one test module each, started several modules at a time.

A module's servers have settings of their own (the subject of its tests), so
they cannot be the session's shared ones; but a server's start is mostly one
process importing vLLM, and a module that starts one server alone leaves one
of this machine's two cores idle for the minute it takes. So the modules that
register here (`register`) have their servers started together, as many
modules at once as fit `AT_ONCE`, when the first of them needs its own; each
module's servers stop when that module ends (`ModuleServers.taken`), as a
module fixture's would, and whatever is left stops before the shared servers
start (`ModuleServers.close`), so the two never share the machine's memory.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from ._server import Server, wait_ready

#: Servers of registered modules running at once, at most: 8 servers of one
#: worker (about 1.5 GiB each) take less than the session's 9 shared servers
#: (15 GiB of this machine's 24), which never run beside them.
AT_ONCE = 8

#: `(model_dirs, log_dir) -> {key: start}`: each `start()` starts one server and returns at once.
Starts = Callable[[Mapping[str, Path], Path], Mapping[str, Callable[[], Server]]]


@dataclass(frozen=True)
class _Module:
    starts: Starts
    #: Strategies the module's servers run: it is skipped where one is missing.
    needs: tuple[str, ...]
    servers: int


_REGISTERED: dict[str, _Module] = {}


def register(module: str, *, needs: Collection[str], servers: int) -> Callable[[Starts], Starts]:
    """Decorate `module`'s `Starts`: its `servers` servers start with other
    registered modules' ones (`ModuleServers.taken(module)` hands them over)."""

    def decorate(starts: Starts) -> Starts:
        _REGISTERED[module] = _Module(starts, tuple(needs), servers)
        return starts

    return decorate


class ModuleServers:
    """The registered modules' servers of one session (the `module_servers` fixture)."""

    def __init__(
        self, model_dirs: Mapping[str, Path], log_root: Path, run_order: list[str], available: Collection[str]
    ) -> None:
        self._model_dirs = model_dirs
        self._log_root = log_root
        #: Registered modules of this run that can run here, in the order they run.
        self._pending = [m for m in run_order if m in _REGISTERED and set(_REGISTERED[m].needs) <= set(available)]
        self._running: dict[str, dict[str, Server]] = {}
        self._closed = False

    @contextlib.contextmanager
    def taken(self, module: str) -> Iterator[dict[str, Server]]:
        """`module`'s servers, ready (started now, with the next modules' ones
        as far as `AT_ONCE` allows, unless started already); stopped when the
        block ends. Fails if offload left a shared-memory file of theirs behind."""
        assert not self._closed, "the module servers were closed: the shared servers are up"
        if module not in self._running:
            self._start_from(module)
        try:
            yield self._running[module]
        finally:
            servers = self._running.pop(module)
            for server in servers.values():
                server.stop()
        left = {key: server.shm_left for key, server in servers.items() if server.shm_left}
        assert not left, f"offload's shared-memory files outlived their servers: {left}"

    def _start_from(self, module: str) -> None:
        if module in self._pending:
            self._pending.remove(module)
        batch = [module]
        count = _REGISTERED[module].servers + sum(len(s) for s in self._running.values())
        while self._pending and count + _REGISTERED[self._pending[0]].servers <= AT_ONCE:
            count += _REGISTERED[self._pending[0]].servers
            batch.append(self._pending.pop(0))
        started: list[Server] = []
        try:
            for name in batch:
                log_dir = self._log_root / name.rpartition(".")[2]
                log_dir.mkdir(parents=True, exist_ok=True)
                self._running[name] = {}
                for key, start in _REGISTERED[name].starts(self._model_dirs, log_dir).items():
                    self._running[name][key] = server = start()
                    started.append(server)
            with concurrent.futures.ThreadPoolExecutor(len(started)) as pool:
                list(pool.map(wait_ready, started))
        except BaseException:
            for name in batch:
                for server in self._running.pop(name, {}).values():
                    server.stop()
            raise

    def close(self) -> None:
        """Stop every server still running (of a module that never asked for
        its own: every test of it skipped or deselected)."""
        self._closed = True
        for name in list(self._running):
            for server in self._running.pop(name).values():
                server.stop()


def module_run_order(session: pytest.Session) -> list[str]:
    """The modules of `session`'s tests, in the order they run."""
    order: list[str] = []
    for item in session.items:
        name = item.module.__name__ if isinstance(item, pytest.Function) else ""
        if name and name not in order:
            order.append(name)
    return order
