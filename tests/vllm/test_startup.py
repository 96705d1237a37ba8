"""Workers are up before the server's port opens: no renderer worker
is spawned under load unless one died."""

from __future__ import annotations

import re

import httpx
import pytest

from ._server import Server
from .conftest import AVAILABLE
from .test_process_crash import renderer_workers, wait_for_workers

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

STARTED = re.compile(r"offload-vllm: (\S+) started (\d+ workers|its worker) in ([0-9.]+)s")


@pytest.mark.parametrize("strategy", [s for s in AVAILABLE if s != "inline"])
def test_workers_start_before_the_port_opens(servers: dict[tuple[str | None, str], Server], strategy: str) -> None:
    server = servers[(strategy, "embed")]
    log = server.log.read_text(errors="replace")
    started = STARTED.search(log)
    assert started, f"no start-up line in the log:\n{server.log_tail()}"
    ready = log.find("Application startup complete")
    assert ready != -1, server.log_tail()
    assert started.start() < ready, "workers were started after the port opened"
    print(f"{strategy}: {started.group(0)}")  # noqa: T201 (the figure a reader checks)


@pytest.mark.skipif("process" not in AVAILABLE, reason="no process server")
def test_no_process_worker_is_spawned_under_load(servers: dict[tuple[str | None, str], Server]) -> None:
    server = servers[("process", "embed")]
    # Both up (WORKERS["process"]), and the express worker (on by default); a
    # worker an earlier test killed is replaced at once, and its replacement
    # may still be starting.
    before = wait_for_workers(server, 3)
    with httpx.Client(timeout=120) as client:
        for i in range(30):
            r = client.post(f"{server.url}/v1/embeddings", json={"model": server.model, "input": f"request {i}"})
            assert r.status_code == 200, r.text
    assert sorted(p.pid for p in renderer_workers(server)) == before


@pytest.mark.parametrize("strategy", AVAILABLE)
def test_vllm_does_not_warn_about_the_adapters_settings(
    servers: dict[tuple[str | None, str], Server], strategy: str
) -> None:
    """vLLM warns about every VLLM_* variable it does not know; the adapter's are
    OFFLOAD_VLLM_*, so vLLM has nothing to warn about."""
    for kind in ("embed", "cross-encoder"):
        log = servers[(strategy, kind)].log.read_text(errors="replace")
        assert "Application startup complete" in log
        unknown = [line for line in log.splitlines() if "Unknown vLLM environment variable" in line and "OFFLOAD" in line]
        assert unknown == []
