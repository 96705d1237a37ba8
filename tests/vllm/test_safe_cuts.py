"""The safe-cut rule of prefix tokenization, against its plain definition.

`_prefix` writes the rule once, as two regular expressions, and finds
cuts with them: `_cut_right` and `_cut_left`, and `_pieces`, the cuts
prefix tokenization tries, which `read_bound` prices a truncated text by on
the event loop. These properties hold them to the rule as `_prefix`'s docstring states
it, walked character by character here:
a prefix may end at `i` where `text[i]` is ASCII whitespace and `text[i - 1]`
a letter or digit (`str.isalnum`); a suffix may start at `i` where
`text[i - 1]` is ASCII whitespace and `text[i]` a letter or digit.
"""

from __future__ import annotations

import itertools
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st
from offload_vllm import _prefix

WHITESPACE = " \t\n\r"

#: Letters and digits of several scripts, the underscore (`\w` but no letter),
#: punctuation, ASCII whitespace and non-ASCII spaces (no safe cut).
texts = st.text(alphabet=st.sampled_from("ab1_,.é٣ \t\n\r\u00a0\u3000漢\u0e33\uff9e"), max_size=400)


def position(data: st.DataObject, text: str) -> int:
    """A position in `text`, or just outside it."""
    return data.draw(st.integers(-2, len(text) + 2))


def cuttable(ch: str) -> bool:
    return ch.isalnum() and ch not in _prefix.GRAPHEME_JOINED


def prefix_ends(text: str) -> list[int]:
    return [i for i in range(1, len(text)) if text[i] in WHITESPACE and cuttable(text[i - 1])]


def suffix_starts(text: str) -> list[int]:
    return [i for i in range(1, len(text)) if text[i - 1] in WHITESPACE and cuttable(text[i])]


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
@given(texts, st.integers(0, 60), st.sampled_from(["right", "left"]), st.sampled_from([(1, 1), (2, 8), (6, 64)]))
def test_pieces_end_at_safe_cuts_and_at_least_double(text: str, count: int, side: str, guess: tuple[int, int]) -> None:
    """The pieces `encode_truncated` may try, and what `read_bound` (which
    prices a truncated text) makes of them: each ends at a safe cut (a suffix
    starts at one), at least twice as long as the one before but the sure
    piece, none past a third of the text; priced at least their sum, and
    the whole text unless the last is the sure piece; never more than twice
    the text."""
    n = len(text)
    ends = prefix_ends(text) if side == "right" else sorted(n - i for i in suffix_starts(text))
    with mock.patch.multiple(_prefix, _CHARS_PER_TOKEN=guess[0], _MIN_CHARS=guess[1]):
        reach = _prefix._reach(text, count, side)  # type: ignore[arg-type]
        lengths = list(_prefix._pieces(reach, count))
        sure = _prefix._sure_piece(reach, count)
        bound = _prefix.read_bound(text, count)
    first = max(guess[1], (count + 1) * guess[0])
    limit = min(n // 3, _prefix._WINDOW * first)
    within = [e for e in ends if e <= limit]
    assert sure == (within[count + 1] if len(within) > count + 1 else None)
    assert all(e in ends and e <= limit for e in lengths)
    if lengths:
        assert lengths[0] == min(e for e in within if e >= first)
    for shorter, longer in itertools.pairwise(lengths):
        assert longer >= 2 * shorter or longer == sure
    ended_sure = bool(lengths) and sure is not None and lengths[-1] >= sure
    assert bound >= sum(lengths) + (0 if ended_sure else n)
    assert sum(lengths) <= n
    assert bound <= 2 * n


def test_a_long_text_is_cut_where_the_walk_would() -> None:
    """A suffix start 10,000 characters back, found after several doublings;
    and none in a text with no whitespace at all."""
    text = "word " + "x" * 10_000 + " tail"
    assert _prefix._cut_left(text, len(text) - 6) == 5
    assert _prefix._cut_right(text, 5) == len("word " + "x" * 10_000)
    assert _prefix._cut_left("x" * 50_000, 49_000) == 0
    assert _prefix._cut_right("x" * 50_000, 10) == 50_000


def test_no_cut_splits_a_grapheme_cluster() -> None:
    """Thai sara am joins the cluster of the space before it: a suffix
    starting at it would be normalized by a character map as a cluster of
    its own, where the whole text's cluster holds the space (an nmt_nfkc map
    then drops the combining mark after it in the suffix alone)."""
    text = "word a \u0e33\u0301 b"
    assert _prefix._cut_left(text, len(text) - 3) == text.index("a ")
