"""An XLM-R-style model on real servers: a tiny `XLMRobertaModel` whose
tokenizer is a SentencePiece Unigram model trained here with `nmt_nfkc`
(a `Precompiled` character map, as XLM-R's), served with the adapter and
without it: truncated multilingual texts embed alike, with the same `usage`,
and prefix tokenization is on for it (no fallback for the map).

Its own two servers (one module, started once): the shared ones serve
MiniLM's WordPiece tokenizer."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ._server import Server, servers_started, start_server
from .conftest import AVAILABLE
from .test_truncation import embed, long_texts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

STRATEGY = "thread"


@pytest.fixture(scope="module")
def xlmr_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str | None, Server]]:
    pytest.importorskip("sentencepiece")
    if STRATEGY not in AVAILABLE:
        pytest.skip(f"no {STRATEGY} server here")
    from benchmarks.harness.models import XLMR_NAME, build_tiny_xlmr

    model = build_tiny_xlmr(tmp_path_factory.mktemp("models") / XLMR_NAME)
    log_dir = tmp_path_factory.mktemp("xlmr-logs")
    starts = {s: _starter(model, s, log_dir) for s in (None, STRATEGY)}
    with contextlib.ExitStack() as stack:
        yield stack.enter_context(servers_started(starts))


def _starter(model: Path, strategy: str | None, log_dir: Path) -> Any:
    return lambda: start_server(model, "tiny-xlmr", strategy, log_dir, workers=2 if strategy else None)


def multilingual_texts() -> list[str]:
    from benchmarks.harness.models import multilingual_text

    return [multilingual_text(600, seed=seed) for seed in range(3)] + long_texts(words=400)


@pytest.mark.parametrize("side", [None, "left", "right"])
def test_truncated_multilingual_texts_embed_as_vllm_does(xlmr_servers: dict[str | None, Server], side: str | None) -> None:
    import numpy as np

    ours_server, vllm_server = xlmr_servers[STRATEGY], xlmr_servers[None]
    for limit in (1, 2, 5, 16, 64, 128, -1):
        body: dict[str, Any] = {"input": multilingual_texts(), "truncate_prompt_tokens": limit}
        if side is not None:
            body["truncation_side"] = side
        ours, our_tokens = embed(ours_server, body)
        theirs, their_tokens = embed(vllm_server, body)
        assert our_tokens == their_tokens, (limit, side)
        np.testing.assert_allclose(ours, theirs, atol=1e-5, err_msg=f"{limit} {side}")
    log = ours_server.log.read_text(errors="replace")
    assert "prefix tokenization on for" in log, log[-2000:]
    assert "prefix tokenization off" not in log
