"""The mixed-traffic benchmark's parts that need no vLLM: which rows today's adapter
can run, the request tally (lost requests included), and verdicts from made-up rounds."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from benchmarks import bench_mixed
from benchmarks.e2e import mixed

TODAY = "usage: python -m offload_vllm serve MODEL [--offload-strategy S] [--offload-workers N] [...]"
LATER = TODAY + " [--offload-scheduling fifo|lanes] [--offload-engine-priority]"


def test_rows_that_need_new_flags_wait_for_them() -> None:
    config, notes = bench_mixed.plan(bench_mixed.ROWS["thread fifo"], TODAY)
    assert config is not None
    assert "--offload-scheduling" not in config.extra_args  # FIFO is all today's adapter does
    assert notes
    assert bench_mixed.plan(bench_mixed.ROWS["thread lanes"], TODAY)[0] is None
    config, notes = bench_mixed.plan(bench_mixed.ROWS["process lanes + priority"], TODAY)
    assert config is None
    assert "--offload-engine-priority" in notes[0]
    for row in bench_mixed.ROWS.values():
        config, notes = bench_mixed.plan(row, LATER)
        assert config == row.config
        assert notes == []


def block(alone_ms: float, flooded_ms: float, heavy_per_s: float) -> dict[str, Any]:
    def phase(p50: float, per_s: float) -> dict[str, Any]:
        return {"sent": 10, "statuses": {"200": 10}, "lost": 0, "ok": 10, "p50_ms": p50, "p99_ms": 2 * p50,
                "max_ms": 2 * p50, "requests_per_s": per_s, "first_error": ""}

    return {"alone": phase(alone_ms, 100.0), "flooded": phase(flooded_ms, 10.0),
            "heavy": phase(500.0, heavy_per_s), "health": {"p99_ms": 5.0, "failures": 0.0}}


def test_verdicts_come_from_the_rounds() -> None:
    blocks = {
        bench_mixed.DEFAULT: [block(10, 1000 + r, 20) for r in range(5)],
        "thread fifo": [block(10, 600 + r, 20) for r in range(5)],
        "thread lanes": [block(10, 20 + r, 19 + 0.1 * r) for r in range(5)],
    }
    evaluated = [bench_mixed.evaluate(t, blocks) for t in bench_mixed.targets(list(blocks))]
    results = {(t["row"], t["metric"], t["baseline"]): t for t in evaluated}
    assert results[(bench_mixed.DEFAULT, "p50_ratio", None)]["met"] is False
    lanes = results[("thread lanes", "p50_ratio", None)]
    assert lanes["met"] is True
    assert lanes["interval"]["median"] == pytest.approx(2.2)
    assert results[("thread lanes", "heavy_per_s", "thread fifo")]["met"] is True  # 0.96x >= 0.9x
    assert results[("thread lanes", "heavy_per_s", bench_mixed.DEFAULT)]["met"] is False  # 0.96x < 1x
    summary = bench_mixed.summarize(blocks)
    assert {(p["row"], p["baseline"]) for p in summary["pairs"]} == {
        ("thread fifo", bench_mixed.DEFAULT), ("thread lanes", bench_mixed.DEFAULT), ("thread lanes", "thread fifo"),
    }
    assert summary["rows"]["thread lanes"]["counts"]["heavy"] == {"sent": 50, "statuses": {"200": 50}, "lost": 0}
    line = bench_mixed.verdict_line(lanes)
    assert "**met**" in line
    assert "2.20" in line


@pytest.fixture
def answering_server() -> Iterator[str]:
    """A loopback HTTP server: /ok answers 200, /busy 503, /drop closes the connection unanswered."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    def serve(conn: socket.socket) -> None:
        with conn:
            while True:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(body) < length:
                    body += conn.recv(65536)
                path = head.split(b" ")[1]
                if path == b"/drop":
                    return
                status = b"200 OK" if path == b"/ok" else b"503 Service Unavailable"
                conn.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Length: 2\r\n\r\n{}")

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{port}"
    listener.close()


@pytest.mark.parametrize(("path", "status"), [("/ok", "200"), ("/busy", "503"), ("/drop", None)])
def test_tally_counts_every_answer_and_every_lost_request(answering_server: str, path: str, status: str | None) -> None:
    tally = mixed.Tally()
    asyncio.run(mixed.closed_loop(answering_server + path, [b"{}"], 2, lambda: tally.sent < 6, tally))
    assert tally.sent == 6
    if status is None:
        assert tally.lost == 6
        assert tally.first_error
    else:
        assert tally.statuses == {status: 6}
        assert tally.lost == 0
    assert len(tally.latencies_s) == (6 if status == "200" else 0)
    summary = tally.summary((0.0, float("inf")))
    assert summary["lost"] == tally.lost
