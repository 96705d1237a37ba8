"""The safe-cut rule of prefix tokenization, against its plain definition.

`_prefix` writes the rule once, as two regular expressions, and finds
cuts with them: `_cut_right` and `_cut_left` for prefix tokenization, and
`first_pieces_within`, which prices a truncated text on the event loop.
These properties hold all three to the rule as `_prefix`'s docstring states
it, walked character by character here:
a prefix may end at `i` where `text[i]` is ASCII whitespace and `text[i - 1]`
a letter or digit (`str.isalnum`); a suffix may start at `i` where
`text[i - 1]` is ASCII whitespace and `text[i]` a letter or digit.
"""

from __future__ import annotations

from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st
from offload_vllm import _prefix

WHITESPACE = " \t\n\r"

#: Letters and digits of several scripts, the underscore (`\w` but no letter),
#: punctuation, ASCII whitespace and non-ASCII spaces (no safe cut).
texts = st.text(alphabet=st.sampled_from("ab1_,.é٣ \t\n\r\u00a0\u3000漢"), max_size=400)


def position(data: st.DataObject, text: str) -> int:
    """A position in `text`, or just outside it."""
    return data.draw(st.integers(-2, len(text) + 2))


def prefix_ends(text: str) -> list[int]:
    return [i for i in range(1, len(text)) if text[i] in WHITESPACE and text[i - 1].isalnum()]


def suffix_starts(text: str) -> list[int]:
    return [i for i in range(1, len(text)) if text[i - 1] in WHITESPACE and text[i].isalnum()]


@given(texts, st.data())
def test_cut_right_is_the_first_prefix_end_in_range(text: str, data: st.DataObject) -> None:
    at = position(data, text)
    last = data.draw(st.none() | st.integers(-2, len(text) + 2))
    within = [i for i in prefix_ends(text) if i >= at and (last is None or i <= last)]
    assert _prefix._cut_right(text, at, last) == (within[0] if within else len(text))


@given(texts, st.data(), st.sampled_from([2, 3, 7, _prefix._BACK_WINDOW]))
def test_cut_left_is_the_last_suffix_start_in_range(text: str, data: st.DataObject, window: int) -> None:
    """Also with backward windows far shorter than the text: a start found
    across two windows, or only after several doublings."""
    at, first = position(data, text), position(data, text)
    within = [i for i in suffix_starts(text) if first <= i <= at]
    with mock.patch.object(_prefix, "_BACK_WINDOW", window):
        assert _prefix._cut_left(text, at, first) == (within[-1] if within else 0)
        if first <= 1:
            assert _prefix._cut_left(text, at) == (within[-1] if within else 0)


@settings(max_examples=500)
@given(texts, st.data())
def test_the_cap_check_finds_the_cuts_prefix_tokenization_makes(text: str, data: st.DataObject) -> None:
    """`first_pieces_within`, which prices a truncated text, agrees with the
    first prefix and suffix `encode_truncated` cuts: each within `limit`
    (narrow ranges too, where one cut at either end decides)."""
    span = data.draw(st.integers(1, max(1, len(text))))
    limit = span + data.draw(st.integers(0, 3) | st.integers(0, len(text)))
    n = len(text)
    expected = n <= limit or (
        any(span <= i <= limit for i in prefix_ends(text))
        and any(n - limit <= i <= n - span for i in suffix_starts(text))
    )
    assert _prefix.first_pieces_within(text, span, limit) == expected


def test_a_long_text_is_cut_where_the_walk_would() -> None:
    """A suffix start 10,000 characters back, found after several doublings;
    and none in a text with no whitespace at all."""
    text = "word " + "x" * 10_000 + " tail"
    assert _prefix._cut_left(text, len(text) - 6) == 5
    assert _prefix._cut_right(text, 5) == len("word " + "x" * 10_000)
    assert _prefix._cut_left("x" * 50_000, 49_000) == 0
    assert _prefix._cut_right("x" * 50_000, 10) == 50_000
