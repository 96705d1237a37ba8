"""The JSON encoder of scoring answers (`_seams/responses.py`): the bytes of
Starlette's `JSONResponse`, which vLLM builds them with, byte for byte, or
its error; pydantic-core's encoder where that gives the same. No server."""

from __future__ import annotations

import json
import math
from typing import Any
from unittest import mock

import pytest
from fastapi.responses import JSONResponse
from hypothesis import given, settings
from hypothesis import strategies as st
from offload_vllm._seams import responses
from offload_vllm._seams.responses import ScoringJSONResponse, same_bytes_in_pydantic_core

#: What a scoring answer's `model_dump()` may hold, and more: every value JSON has.
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=24,
)


def starlettes(content: Any) -> bytes | type[BaseException]:
    """Starlette's body for `content`, or the type of the error it raises."""
    try:
        return bytes(JSONResponse(content=content).body)
    except (ValueError, UnicodeEncodeError) as error:  # NaN or infinity; a lone surrogate
        return type(error)


def ours(content: Any) -> bytes | type[BaseException]:
    try:
        return bytes(ScoringJSONResponse(content=content).body)
    except (ValueError, UnicodeEncodeError) as error:
        return type(error)


@settings(max_examples=200)
@given(JSON_VALUES)
def test_the_body_is_starlettes_or_its_error(content: Any) -> None:
    assert ours(content) == starlettes(content)


SCORES = st.floats(min_value=1e-4, max_value=1e16, exclude_max=True) | st.floats(
    max_value=-1e-4, min_value=-1e16, exclude_min=True
)


@settings(max_examples=100)
@given(st.lists(SCORES | st.just(0.0) | st.just(-0.0), min_size=1, max_size=200))
def test_floats_written_without_an_exponent_are_taken_from_pydantic_core(scores: list[float]) -> None:
    content = [{"relevance_score": score} for score in scores]
    assert same_bytes_in_pydantic_core(content)
    assert ours(content) == starlettes(content)


def test_every_character_is_written_as_starlette_writes_it() -> None:
    every = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    assert same_bytes_in_pydantic_core({"text": every})
    assert ours({"text": every}) == starlettes({"text": every})
    assert ours({"text": "a lone \ud800"}) is UnicodeEncodeError is starlettes({"text": "a lone \ud800"})


@pytest.mark.parametrize(
    "score", [1e-5, 9.99e-5, 1e16, 1e300, 5e-324, math.inf, -math.inf, math.nan]
)
def test_other_floats_are_left_to_starlette(score: float) -> None:
    """Below 1e-4 Python writes an exponent and pydantic-core does not; a
    non-finite float Starlette refuses (`allow_nan=False`)."""
    content = {"relevance_score": score}
    assert not same_bytes_in_pydantic_core(content)
    assert ours(content) == starlettes(content)


def test_a_rerank_answer_is_encoded_by_pydantic_core_as_vllm_builds_it() -> None:
    """After `install_response_encoder`, vLLM's scoring serving builds its
    answers with `ScoringJSONResponse`: a rerank answer of long documents
    (scores from 1e-4 to 1) is the body Starlette would give, and json.dumps
    never runs for it; a score below 1e-4 is left to Starlette."""
    from vllm.entrypoints.pooling.scoring import serving as scoring_serving

    from .test_cost import _rerank_body

    documents = [f"document {i}: " + 'the "quick" brown fox\n\t狐狸 🦊 ' * 300 for i in range(32)]
    scores = [10 ** -(i / 8) for i in range(32)]  # 1 down to ~1.3e-4
    original = vars(scoring_serving)["JSONResponse"]
    try:
        scoring_serving.JSONResponse = JSONResponse  # type: ignore[attr-defined]
        theirs = _rerank_body(documents, scores)
        responses.install_response_encoder()
        responses.install_response_encoder()  # idempotent
        assert vars(scoring_serving)["JSONResponse"] is ScoringJSONResponse
        dumps = mock.Mock(wraps=json.dumps)
        with mock.patch("starlette.responses.json.dumps", dumps):
            assert _rerank_body(documents, scores) == theirs
            assert dumps.call_count == 0
            _rerank_body(documents, [*scores[:-1], 1e-5])
            assert dumps.call_count == 1
    finally:
        scoring_serving.JSONResponse = original  # type: ignore[attr-defined]
