"""The express worker through a real server with its default bound
(`OFFLOAD_VLLM_EXPRESS_COST` unset, `process`): one more worker process,
started before the port opens, at the server's priority, that answers a
small request while the only regular worker cannot run at all (stopped with
SIGSTOP in the middle of a large request)."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import httpx
import psutil
import pytest

from ._module_servers import ModuleServers, register
from ._server import Server, scrape, start_server, total
from .conftest import AVAILABLE
from .test_process_crash import renderer_workers, wait_for_workers

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(900),
    pytest.mark.skipif("process" not in AVAILABLE, reason="needs the process strategy"),
]


@register(__name__, needs=("process",), servers=1)
def starts(model_dirs: Mapping[str, Path], log_dir: Path) -> dict[str, Callable[[], Server]]:
    # The express worker is on by default (OFFLOAD_VLLM_EXPRESS_COST unset).
    # Every call on the executor: a one-sentence request would otherwise run on the loop.
    env = {"OFFLOAD_VLLM_INLINE_COST": "0"}
    start = lambda: start_server(  # noqa: E731
        model_dirs["embed"], "minilm", "process", log_dir, workers=1, extra_env=env,
    )
    return {"express": start}


@pytest.fixture(scope="module")
def server(module_servers: ModuleServers) -> Iterator[Server]:
    with module_servers.taken(__name__) as started:
        yield started["express"]


def ready_workers(server: Server) -> list[psutil.Process]:
    wait_for_workers(server, 2)
    return renderer_workers(server)


def test_the_express_worker_starts_with_the_others_at_the_servers_priority(server: Server) -> None:
    server_nice = psutil.Process(server.proc.pid).nice()
    assert sorted(p.nice() for p in ready_workers(server)) == [server_nice, min(19, server_nice + 10)]


def test_a_small_request_is_answered_while_the_regular_worker_is_held(server: Server) -> None:
    """The regular worker is stopped (SIGSTOP) in the middle of a large
    request's rendering (priced above the bound, so its call can only go
    there): small requests are still answered, by the express worker."""
    workers = {p.pid: p.nice() for p in ready_workers(server)}
    regular = max(workers, key=workers.__getitem__)  # the one at nice +10
    body = {"model": server.model, "input": "a small request while the regular worker cannot run"}
    alone = httpx.post(f"{server.url}/v1/embeddings", json=body, timeout=120)
    assert alone.status_code == 200, alone.text
    large = {"model": server.model, "input": "word " * 8_000}  # priced 40,000
    os.kill(regular, signal.SIGSTOP)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        try:
            held = pool.submit(httpx.post, f"{server.url}/v1/embeddings", json=large, timeout=300)
            deadline = time.monotonic() + 60
            while total(scrape(server), "offload_running_calls") < 1:
                assert time.monotonic() < deadline, "the large request's call never reached the worker"
                time.sleep(0.05)
            for _ in range(3):
                r = httpx.post(f"{server.url}/v1/embeddings", json=body, timeout=60)
                assert r.status_code == 200, r.text
                embedding = r.json()["data"][0]["embedding"]
                assert embedding == pytest.approx(alone.json()["data"][0]["embedding"], abs=1e-5)
            assert not held.done()
        finally:
            os.kill(regular, signal.SIGCONT)
        # Once the worker runs again, the large request is answered (vLLM
        # refuses it as longer than the model's context: a 400, not a 5xx).
        assert held.result(timeout=300).status_code < 500
