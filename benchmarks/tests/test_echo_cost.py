"""`echo-cost`: its documents and its arguments (the measurement itself runs in the smoke test)."""

from __future__ import annotations

import json

from benchmarks.calibration import echo_cost


def test_every_kind_of_document_is_as_long_as_the_rerank_benchmarks_prose() -> None:
    prose = echo_cost.documents("prose", 4, 60)
    for kind in ("multilingual", "escapes"):
        assert list(map(len, echo_cost.documents(kind, 4, 60))) == list(map(len, prose)), kind
    assert echo_cost.documents("empty", 4, 60) == [""] * 4


def test_the_worst_case_documents_need_an_escape_or_four_bytes_a_character() -> None:
    # What makes them the encoders' worst case: no character is written as
    # itself in one byte (a control character is escaped, an emoji is four
    # bytes of UTF-8), and more than four bytes a character in all.
    for text in echo_cost.documents("escapes", 2, 60):
        assert all(len(json.dumps(c, ensure_ascii=False)[1:-1].encode()) > 1 for c in set(text))
        assert len(json.dumps(text, ensure_ascii=False)[1:-1].encode()) > 4 * len(text)
