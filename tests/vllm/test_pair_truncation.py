"""Truncated (query, document) pairs on real servers: a cross-encoder's
`/score`, `/rerank` and `/v2/rerank` with long documents give vLLM's own
scores and `usage` with prefix tokenization of pairs (on by default), and a
bi-encoder's `/score` (each side a prompt of its own) gives vLLM's too."""

from __future__ import annotations

import json
from typing import Any

import httpx
import numpy as np
import pytest

from ._server import Server, scrape, total
from .conftest import AVAILABLE
from .test_truncation import long_texts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

QUERY = "what is the quick brown fox's favourite tokenization?"
#: A query longer than most limits: vLLM's longest-first cut takes from it too.
LONG_QUERY = " ".join(["long query words"] * 60)

#: 1 to the model's length (256 here; -1), and past the special tokens alone:
#: for the default strategy, on one route (the routes differ only in how the
#: request and answer are shaped: every route at SOME_LIMITS shows that).
LIMITS = (1, 2, 3, 4, 5, 16, 33, 64, 128, 255, -1)
SOME_LIMITS = (3, 64, -1)
ROUTES = ("/score", "/rerank", "/v2/rerank")

#: vLLM's own answers, asked once per server, route and body for every strategy's comparison.
_vllms_answers: dict[str, tuple[object, Any, Any]] = {}


def vllms_answer(server: Server, path: str, body: dict[str, Any]) -> tuple[object, Any, Any]:
    key = json.dumps([server.url, path, body], sort_keys=True)
    if key not in _vllms_answers:
        _vllms_answers[key] = scored(server, path, body)
    return _vllms_answers[key]


def scored(server: Server, path: str, body: dict[str, Any]) -> tuple[object, list[float] | None, int | None]:
    """(status, scores by document index, usage's prompt tokens) of one scoring
    call, or (status, error message) for a refusal."""
    r = httpx.post(f"{server.url}{path}", json={"model": server.model, **body}, timeout=120)
    data = r.json()
    if r.status_code != 200:
        return r.status_code, data.get("error", {}).get("message"), None
    if path == "/score":
        scores = {d["index"]: d["score"] for d in data["data"]}
    else:
        scores = {d["index"]: d["relevance_score"] for d in data["results"]}
    usage = data.get("usage") or data.get("meta", {}).get("billed_units", {})
    tokens = usage.get("prompt_tokens", usage.get("input_tokens"))
    return r.status_code, [scores[i] for i in sorted(scores)], tokens


def assert_same(ours: tuple[object, Any, Any], theirs: tuple[object, Any, Any], what: str) -> None:
    assert ours[0] == theirs[0], (what, ours, theirs)
    if ours[0] != 200:
        assert ours[1] == theirs[1], what
        return
    assert ours[2] == theirs[2], (what, "usage", ours[2], theirs[2])
    np.testing.assert_allclose(ours[1], theirs[1], atol=1e-5, err_msg=what)


def bodies(path: str, query: str, documents: list[str]) -> dict[str, Any]:
    if path == "/score":
        return {"queries": query, "documents": documents}
    return {"query": query, "documents": documents}


@pytest.mark.parametrize("side", [None, "left", "right"])
def test_truncated_pairs_score_as_vllm_does(
    servers: dict[tuple[str | None, str], Server], strategy: str, side: str | None
) -> None:
    """Every text family of the truncation tests as documents of 600 words,
    a short query and a long one, limits 1 to the model's length, on each
    scoring route: vLLM's scores and prompt tokens, pair by pair."""
    if strategy not in AVAILABLE:
        pytest.skip(f"no {strategy} server here")
    ours_server, vllm_server = servers[(strategy, "cross-encoder")], servers[(None, "cross-encoder")]
    documents = long_texts()
    for limit in LIMITS if strategy == "thread" else SOME_LIMITS:
        for query in (QUERY, LONG_QUERY):
            for path in ROUTES if limit in SOME_LIMITS else ROUTES[1:2]:
                body = {**bodies(path, query, documents), "truncate_prompt_tokens": limit}
                if side is not None:
                    body["truncation_side"] = side
                what = f"{path} limit={limit} side={side} query={query[:12]!r}"
                assert_same(scored(ours_server, path, body), vllms_answer(vllm_server, path, body), what)
    if strategy in ("inline", "thread", "async-renderer"):  # remote workers log in their own processes
        # The pair path answered (it logs once), not only whole-pair tokenization.
        assert "prefix tokenization on for text pairs" in ours_server.log.read_text(errors="replace")


def test_untruncated_long_pairs_are_refused_alike(servers: dict[tuple[str | None, str], Server], strategy: str) -> None:
    """No `truncate_prompt_tokens`: vLLM's tokenizer stops at one past the
    model's length and vLLM refuses the pair; so does the server with the adapter."""
    if strategy not in AVAILABLE:
        pytest.skip(f"no {strategy} server here")
    ours_server, vllm_server = servers[(strategy, "cross-encoder")], servers[(None, "cross-encoder")]
    body = bodies("/rerank", QUERY, long_texts(words=300)[:2])
    ours, theirs = scored(ours_server, "/rerank", body), scored(vllm_server, "/rerank", body)
    assert ours == theirs
    assert theirs[0] == 400, theirs


def test_a_bi_encoders_truncated_pairs_score_as_vllm_does(
    servers: dict[tuple[str | None, str], Server], strategy: str
) -> None:
    """An embedding model's `/score` tokenizes the query and each document as
    prompts of their own (prefix tokenization of single texts): vLLM's scores and usage."""
    if strategy not in AVAILABLE:
        pytest.skip(f"no {strategy} server here")
    ours_server, vllm_server = servers[(strategy, "embed")], servers[(None, "embed")]
    documents = long_texts()
    for limit in SOME_LIMITS:
        for side in (None, "left"):
            body: dict[str, Any] = {**bodies("/score", QUERY, documents), "truncate_prompt_tokens": limit}
            if side is not None:
                body["truncation_side"] = side
            what = f"bi-encoder limit={limit} side={side}"
            assert_same(scored(ours_server, "/score", body), vllms_answer(vllm_server, "/score", body), what)


def test_a_rerank_answer_echoes_its_documents_as_vllms_does_built_off_the_loop(
    servers: dict[tuple[str | None, str], Server], strategy: str
) -> None:
    """A rerank answer carries every document back: documents of quotes,
    backslashes, tabs, a control character, CJK and emoji come back as in
    vLLM's own answer (scores within 1e-5, the same `usage`). Long enough
    that the answer is priced past the inline cost (`_cost.ECHO_COST_PER_CHARACTER`),
    it is built on a worker where the strategy runs small calls on the loop
    (`offload_vllm_loop_calls_total{call="postprocess"}` does not move), and a
    short one's answer is built on the loop."""
    if strategy not in AVAILABLE:
        pytest.skip(f"no {strategy} server here")
    ours_server, vllm_server = servers[(strategy, "cross-encoder")], servers[(None, "cross-encoder")]
    documents = [f"{i}: " + 'a "quoted" back\\slash, a tab\t, a control \x01 character, 狐狸 and 🦊; ' * 40 for i in range(8)]
    body = {"model": ours_server.model, "query": QUERY, "documents": documents, "truncate_prompt_tokens": 64}

    def built_on_the_loop() -> float | None:
        values = scrape(ours_server)
        if not any(name == "offload_vllm_loop_calls_total" for name, _ in values):
            return None  # no call runs on the loop under this strategy
        return total(values, "offload_vllm_loop_calls_total", call="postprocess")

    before = built_on_the_loop()
    ours = httpx.post(f"{ours_server.url}/rerank", json=body, timeout=120)
    after = built_on_the_loop()
    theirs = httpx.post(f"{vllm_server.url}/rerank", json=body, timeout=120)
    assert ours.status_code == theirs.status_code == 200, (ours.text[:300], theirs.text[:300])
    ours_data, theirs_data = ours.json(), theirs.json()
    ours_results = sorted(ours_data["results"], key=lambda r: r["index"])
    theirs_results = sorted(theirs_data["results"], key=lambda r: r["index"])
    assert [r["document"] for r in ours_results] == [r["document"] for r in theirs_results]
    assert [r["document"]["text"] for r in ours_results] == documents
    assert ours_data["usage"] == theirs_data["usage"]
    np.testing.assert_allclose(
        [r["relevance_score"] for r in ours_results], [r["relevance_score"] for r in theirs_results], atol=1e-5
    )
    if before is None:
        return
    assert after == before
    short = httpx.post(
        f"{ours_server.url}/rerank", json={"model": ours_server.model, "query": QUERY, "documents": ["a", "b"]}, timeout=120
    )
    assert short.status_code == 200
    assert built_on_the_loop() == before + 1
