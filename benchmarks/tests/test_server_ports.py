"""`harness.server.free_port`: ports for servers that bind them later."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from benchmarks.harness import server


def test_a_free_port_is_below_the_ephemeral_range_and_nothing_listens_on_it() -> None:
    ephemeral = server.ephemeral_ports()
    if ephemeral.start <= server.LISTEN_PORTS_FROM:
        pytest.skip(f"this machine's ephemeral range starts at {ephemeral.start}: nothing below it to choose")
    for _ in range(50):
        port = server.free_port()
        assert server.LISTEN_PORTS_FROM <= port < ephemeral.start
        with socket.socket() as s:
            s.bind((server.HOST, port))


def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    listening = socket.socket()
    listening.bind((server.HOST, 0))
    listening.listen()
    taken = listening.getsockname()[1]
    with socket.socket() as s:
        s.bind((server.HOST, 0))
        free = s.getsockname()[1]
    choices: Iterator[int] = iter([taken, taken, free])

    class Picks:
        def randrange(self, start: int, stop: int) -> int:
            return next(choices)

    monkeypatch.setattr(server, "ephemeral_ports", lambda: range(65000, 65536))
    monkeypatch.setattr(server.random, "SystemRandom", Picks)
    with listening:
        assert server.free_port() == free


def test_with_no_ports_below_the_ephemeral_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "ephemeral_ports", lambda: range(1024, 65536))

    class NoPicks:
        def randrange(self, start: int, stop: int) -> int:
            raise AssertionError("nothing below the range to pick from")

    monkeypatch.setattr(server.random, "SystemRandom", NoPicks)
    port = server.free_port()
    with socket.socket() as s:
        s.bind((server.HOST, port))
