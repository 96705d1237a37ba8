"""Servers started side by side, measured one at a time: the others' process
groups stopped (SIGSTOP) while one is measured, so that they take none of its
cores (an idle vLLM server still uses CPU, most just after a flood of its
own), and the CPU they use meanwhile read from `/proc`."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from types import TracebackType

from typing_extensions import Self

from benchmarks.harness import procstat
from benchmarks.harness.server import wait_healthy

#: A resumed server answers `/health` within milliseconds; a minute means it is broken.
RESUME_TIMEOUT_S = 60.0


class IdleServers:
    """The servers whose row is not being measured: their process groups stay
    stopped (SIGSTOP) except while `serving` their row. Every stopped server is
    resumed on exit, whatever ended the run, so none is left stopped for its
    shutdown."""

    def __init__(self, servers: dict[str, tuple[str, int]]) -> None:
        self._urls = {row: url for row, (url, _) in servers.items()}
        # running_servers starts each server in its own session: its process
        # group's id is the API server's pid.
        self._groups = {row: pid for row, (_, pid) in servers.items()}
        self._stopped: set[str] = set()

    def __enter__(self) -> Self:
        for row in self._groups:
            self._stop(row)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        for row in list(self._stopped):
            self._resume(row)

    def _stop(self, row: str) -> None:
        self._stopped.add(row)
        # A server that died is reported when its row is served next (`/health`).
        with suppress(ProcessLookupError):
            os.killpg(self._groups[row], signal.SIGSTOP)

    def _resume(self, row: str) -> None:
        with suppress(ProcessLookupError):
            os.killpg(self._groups[row], signal.SIGCONT)
        self._stopped.discard(row)

    @contextmanager
    def serving(self, row: str) -> Iterator[None]:
        """`row`'s server running (resumed and answering `/health`) for the block."""
        if row in self._stopped:
            self._resume(row)
            wait_healthy(self._urls[row], RESUME_TIMEOUT_S)
        try:
            yield
        finally:
            self._stop(row)

    def others_cpu(self, row: str) -> float:
        """CPU seconds used so far by every process of the servers other than `row`'s."""
        return procstat.group_cpu({pgid for name, pgid in self._groups.items() if name != row})
