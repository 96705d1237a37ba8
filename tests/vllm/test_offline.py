"""`LLM(...).embed()/score()` under each strategy: runs docs/examples/vllm_offline.py.

With a queue bound set (`OFFLOAD_VLLM_MAX_QUEUE=0`, one worker: one call in
flight), as a server's settings would be: an offline batch is never refused
(an offline batch has no client to refuse), whatever its size.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from offload_vllm._kinds import STRATEGY_ROWS

from ._server import ENGINE_IN_ONE_PROCESS, Server
from .conftest import AVAILABLE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

EXAMPLE = Path(__file__).parents[2] / "docs" / "examples" / "vllm_offline.py"
QUEUED = [s for s, row in STRATEGY_ROWS.items() if row.kind.queue]
POOLED = [s for s, row in STRATEGY_ROWS.items() if row.kind.pool]


def run_offline(strategy: str, model_dirs: dict[str, Path], log: Path) -> dict[str, list[float]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_OFFLOAD_", "OFFLOAD_"))}
    # The engine and the model in the caller's process: vLLM's config then
    # holds the model's layers when the render map starts, with attention
    # classes made at run time that pickle cannot send, and the `process`
    # strategy's workers get the config without them (a PicklingError at
    # `LLM(...)` before). With vLLM's default engine processes the config
    # holds no model, as in a server (the shared servers' `process` rows),
    # and each engine costs two more processes importing vLLM and torch.
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OFFLOAD_VLLM_STRATEGY=strategy, **ENGINE_IN_ONE_PROCESS)
    if strategy in QUEUED:
        env["OFFLOAD_VLLM_MAX_QUEUE"] = "0"
    if strategy in POOLED:
        env["OFFLOAD_VLLM_WORKERS"] = "1"
    args = [sys.executable, str(EXAMPLE), str(model_dirs["embed"]), str(model_dirs["cross-encoder"])]
    proc = subprocess.run(args, env=env, check=False, capture_output=True, text=True, timeout=800, start_new_session=True)
    output = proc.stdout + proc.stderr  # vLLM logs to stdout
    log.write_text(output)
    assert proc.returncode == 0, output[-3000:]
    assert f"offload-vllm: LLM offline render map runs under strategy {strategy!r}" in output
    last_json = [line for line in proc.stdout.splitlines() if line.startswith("{")][-1]
    result: dict[str, list[float]] = json.loads(last_json)
    return result


@pytest.fixture(scope="session")
def offline_results(
    model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, list[float]] | BaseException]:
    """One offline run per strategy, two at a time: each mostly waits on engine
    start-up, and four at once with the shared servers up exhausted this
    machine's memory (they now run before the servers start)."""
    log_dir = tmp_path_factory.mktemp("offline-logs")
    with concurrent.futures.ThreadPoolExecutor(min(2, len(AVAILABLE))) as pool:
        futures = {s: pool.submit(run_offline, s, model_dirs, log_dir / f"{s}.log") for s in AVAILABLE}
    return {s: f.exception() or f.result() for s, f in futures.items()}


def test_offline_embed_and_score(
    strategy: str,
    model_dirs: dict[str, Path],
    # Before `servers`: the offline engines run before the shared servers
    # start (tests/vllm/conftest.py runs this module first among theirs), so
    # that the two never share the machine's memory.
    offline_results: dict[str, dict[str, list[float]] | BaseException],
    servers: dict[tuple[str | None, str], Server],
) -> None:
    from sentence_transformers import SentenceTransformer

    from docs.examples.vllm_offline import DOCS, QUERY, TEXTS

    result = offline_results[strategy]
    if isinstance(result, BaseException):
        raise result
    ours = np.array(result["embeddings"])
    reference = SentenceTransformer(str(model_dirs["embed"]), device="cpu").encode(
        TEXTS, normalize_embeddings=True
    )
    cosine = np.sum(ours * reference, axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(reference, axis=1))
    assert cosine.min() >= 0.9999, cosine

    server = servers[(strategy, "cross-encoder")]
    import httpx

    online = httpx.post(
        f"{server.url}/score", json={"model": server.model, "queries": QUERY, "documents": DOCS}, timeout=60
    ).json()
    online_scores = [d["score"] for d in sorted(online["data"], key=lambda d: d["index"])]
    np.testing.assert_allclose(result["scores"], online_scores, atol=1e-5)
