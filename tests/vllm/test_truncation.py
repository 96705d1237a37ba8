"""Truncated inputs and concurrent requests on real servers: prefix tokenization
gives vLLM's own embeddings and token counts; async-renderer's tokenizer
batches join calls of concurrent requests."""

from __future__ import annotations

import json
import random
import sys
from typing import Any

import httpx
import numpy as np
import pytest

from ._batches import send_waves, tokenizer_batches
from ._server import Server
from .conftest import AVAILABLE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

# Long texts of every kind prefix tokenization must cut right: ASCII, accents
# (composed and combining), CJK, emoji sequences, odd whitespace, special-token
# look-alikes.
_PIECES = {
    "ascii": ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog,", "tokenization.", "42"],
    "accents": ["café", "cafe\u0301", "naïve", "Ångström", "résumé", "straße", "ΣΟΦΊΑ"],
    "cjk": ["東京", "日本語の文章", "你好世界", "한국어"],
    "emoji": ["👩\u200d👩\u200d👧", "🇫🇷", "👍🏽", "1\ufe0f\u20e3", "🙂🙂"],
    "whitespace": ["word", "\t", "\n\n", "\u00a0", "\u3000", "  ", "end"],
    "specials": ["[CLS]", "[SEP]", "[MASK]", "<s>", "##ing", "[UNK]"],
}
_SEPARATORS = [" ", " ", " ", "  ", "\t", "\n", "\u00a0", " \u3000 "]


def long_texts(words: int = 600) -> list[str]:
    rng = random.Random(7)
    texts = []
    for kind, pieces in _PIECES.items():
        pool = pieces + _PIECES["ascii"] if kind != "ascii" else pieces
        texts.append("".join(rng.choice(pool) + rng.choice(_SEPARATORS) for _ in range(words)))
    return texts


def embed(server: Server, body: dict[str, Any]) -> tuple[np.ndarray, int]:
    r = httpx.post(f"{server.url}/v1/embeddings", json={"model": server.model, **body}, timeout=120)
    assert r.status_code == 200, r.text[:500]
    data = r.json()
    vectors = np.array([d["embedding"] for d in sorted(data["data"], key=lambda d: d["index"])])
    return vectors, int(data["usage"]["prompt_tokens"])


#: Limits for the default strategy: 1 to 128 and the model's length (-1).
ALL_LIMITS = (1, 2, 3, 5, 16, 33, 64, 128, -1)
#: The others run the same prefix tokenization elsewhere (a worker process, a
#: batch): a few limits show it is wired there, at a fraction of the time.
SOME_LIMITS = (1, 16, 128, -1)

#: vLLM's own answers, asked once per body for every strategy's comparison.
_vllms_answers: dict[str, tuple[np.ndarray, int]] = {}


def vllms_answer(server: Server, body: dict[str, Any]) -> tuple[np.ndarray, int]:
    key = json.dumps(body, sort_keys=True)
    if key not in _vllms_answers:
        _vllms_answers[key] = embed(server, body)
    return _vllms_answers[key]


@pytest.mark.parametrize("side", [None, "left", "right"])
def test_truncated_long_texts_embed_as_vllm_does(
    servers: dict[tuple[str | None, str], Server], strategy: str, side: str | None
) -> None:
    """Prefix tokenization (on by default) gives vLLM's own embeddings and
    `prompt_tokens`, text by text, at limits 1 to 128 and the model's length (-1)."""
    if strategy not in AVAILABLE:
        pytest.skip(f"no {strategy} server here")
    ours_server, vllm_server = servers[(strategy, "embed")], servers[(None, "embed")]
    texts = long_texts()
    for limit in ALL_LIMITS if strategy == "thread" else SOME_LIMITS:
        for text in texts:
            body: dict[str, Any] = {"input": [text], "truncate_prompt_tokens": limit}
            if side is not None:
                body["truncation_side"] = side
            ours, our_tokens = embed(ours_server, body)
            theirs, their_tokens = vllms_answer(vllm_server, body)
            assert our_tokens == their_tokens, (limit, side, text[:40])
            np.testing.assert_allclose(ours, theirs, atol=1e-5, err_msg=f"{limit} {side} {text[:40]!r}")
    if strategy in ("inline", "thread", "async-renderer"):  # remote workers log in their own processes
        # It was on, not skipped for this tokenizer (which would give vLLM's results as well).
        assert "prefix tokenization on for" in ours_server.log.read_text(errors="replace")


def test_concurrent_requests_share_tokenizer_batches(
    servers: dict[tuple[str | None, str], Server], record_property: Any
) -> None:
    """async-renderer: 5 waves of 64 concurrent one-input requests; vLLM builds
    new tokenization parameters for each, equal by value, so they share batches
    (`offload_batch_size` on /metrics): not all batches of one."""
    if "async-renderer" not in AVAILABLE:
        pytest.skip("no async-renderer server here")
    server = servers[("async-renderer", "embed")]

    calls_before, batches_before = tokenizer_batches(server)
    send_waves(server, 5)
    calls_after, batches_after = tokenizer_batches(server)
    calls, batches = calls_after - calls_before, batches_after - batches_before
    assert calls == 5 * 64
    # Keyed by the parameters' identity (each request has its own object and one
    # input), no call could join another: 320 batches. How big they get (with the
    # adapter's default window) is benchmarks/calibration/batch_wait.py's to measure.
    # Shown with `pytest -s` (and in the junit XML).
    record_property("tokenizer_batch_mean", calls / batches)
    sys.stdout.write(f"\nasync-renderer: {calls:g} tokenization calls in {batches:g} batches (mean {calls / batches:.1f})\n")
    assert batches < calls, f"{batches:g} tokenizer batches for {calls:g} calls: none joined another request's"


def test_a_text_vllm_refuses_is_refused_alike(servers: dict[tuple[str | None, str], Server], strategy: str) -> None:
    """A JSON `\\ud800` escape (a lone surrogate) past the part of a truncated
    text that prefix tokenization would read, or before it: vLLM's tokenizer
    refuses the text, and so does the server with the adapter, with the same
    status and message."""
    if strategy not in AVAILABLE:
        pytest.skip(f"no {strategy} server here")
    ours_server, vllm_server = servers[(strategy, "embed")], servers[(None, "embed")]
    words = "word " * 400
    for text, side in ((words + "\\ud800", "right"), (words + "\\ud800", "left"), ("\\udfff " + words, "left")):
        raw = '{"model": "%s", "input": ["%s"], "truncate_prompt_tokens": 4, "truncation_side": "%s"}'
        answers = []
        for server in (ours_server, vllm_server):
            r = httpx.post(
                f"{server.url}/v1/embeddings",
                content=(raw % (server.model, text, side)).encode(),
                headers={"content-type": "application/json"},
                timeout=60,
            )
            answers.append((r.status_code, r.json().get("error", {}).get("message")))
        assert answers[0] == answers[1], (side, text[:12], answers)
        assert answers[1][0] == 400, answers
