"""Readiness beside admission from a fresh server's first request: a real
`thread` server (one worker, the docs' cost bound, the health port) flooded
from its first request, each admission decision compared with what `/ready`
said at that moment, by the server's own count
(`offload_vllm_readiness_at_admission_total`) and by a prober outside it."""

from __future__ import annotations

import bisect
import concurrent.futures
import functools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ._server import Server, free_port, scrape, servers_started, start_server, total

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

#: A bound of about three requests (the docs' 2,000,000 is not reached by 32
#: clients on one worker here), and requests like the user's who
#: found readiness at 200 through a first flood: 16 texts of 9,749 characters.
MAX_QUEUED_COST = 500_000
BODY = {"input": ["offload readiness " * 541 + "x" * 11] * 16, "truncate_prompt_tokens": 16}
CLIENTS = 32
FLOOD_S = 15.0
DECISIONS = "offload_vllm_readiness_at_admission_total"


@pytest.fixture(scope="module")
def server(model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, int]]:
    port = free_port()
    env = {
        "OFFLOAD_VLLM_MAX_QUEUED_COST": str(MAX_QUEUED_COST),
        "OFFLOAD_VLLM_HEALTH_PORT": str(port),
        "OFFLOAD_VLLM_HEALTH_MAX_STALL": "10",
    }
    start = functools.partial(
        start_server, model_dirs["embed"], "minilm", "thread", tmp_path_factory.mktemp("readiness"),
        workers=1, extra_env=env,
    )
    with servers_started({"ready": start}) as servers:
        yield servers["ready"], port


def _probe_ready(port: int, stop: threading.Event, seen: list[tuple[float, int]]) -> None:
    with httpx.Client(timeout=10) as client:
        while not stop.is_set():
            sent = time.monotonic()
            code = client.get(f"http://127.0.0.1:{port}/ready").status_code
            seen.append(((sent + time.monotonic()) / 2, code))
            time.sleep(0.005)


def _client(server: Server, until: float, answers: list[tuple[float, int]]) -> None:
    with httpx.Client(timeout=120) as client:
        while time.monotonic() < until:
            sent = time.monotonic()
            code = client.post(f"{server.url}/v1/embeddings", json={"model": server.model, **BODY}).status_code
            answers.append((sent, code))
            if code == 503:
                time.sleep(0.05)


def test_admission_agrees_with_readiness_from_the_first_request(server: tuple[Server, int]) -> None:
    """No request before the flood: from the first decision on, at least 95%
    of the decisions (admitted with `/ready` 200, refused with 503) agree, as
    the server counts them; and refusals happened (the bound was reached).
    The prober's figure (the probe nearest each request's sending) is
    printed beside, and must agree for at least 80% (it cannot see a
    decision's moment, only a few milliseconds around it)."""
    served, port = server
    counted_before = {(d, r): total(scrape(served), DECISIONS, decision=d, ready=r)
                      for d in ("admitted", "refused") for r in ("200", "503")}
    assert sum(counted_before.values()) == 0, counted_before
    stop = threading.Event()
    probes: list[tuple[float, int]] = []
    prober = threading.Thread(target=_probe_ready, args=(port, stop, probes), daemon=True)
    prober.start()
    while not probes:
        time.sleep(0.01)
    answers: list[tuple[float, int]] = []
    until = time.monotonic() + FLOOD_S
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        for done in [pool.submit(_client, served, until, answers) for _ in range(CLIENTS)]:
            done.result()
    stop.set()
    prober.join()
    counted = {(d, r): total(scrape(served), DECISIONS, decision=d, ready=r)
               for d in ("admitted", "refused") for r in ("200", "503")}
    decided = sum(counted.values())
    agree = counted["admitted", "200"] + counted["refused", "503"]
    times = [at for at, _ in probes]

    def nearest(at: float) -> int:
        i = bisect.bisect_left(times, at)
        best = min((j for j in (i - 1, i) if 0 <= j < len(times)), key=lambda j: abs(times[j] - at))
        return probes[best][1]

    outside = [(code == 200) == (nearest(sent) == 200) for sent, code in answers if code in (200, 503)]
    refused = sum(code == 503 for _, code in answers)
    print(  # noqa: T201 (the figures, for the report: run with -s)
        f"counted {counted}; agreement {agree / decided:.3f} of {decided:g}; "
        f"prober agreement {sum(outside) / len(outside):.3f} of {len(outside)} answers, {len(probes)} probes"
    )
    assert {code for _, code in answers} <= {200, 503}, answers
    assert refused >= 1, counted
    assert counted["refused", "503"] + counted["refused", "200"] >= 1, counted
    assert agree / decided >= 0.95, counted
    assert sum(outside) / len(outside) >= 0.80, (counted, len(outside))
