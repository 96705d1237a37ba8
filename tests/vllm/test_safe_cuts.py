"""The safe-cut rule of prefix tokenization, against its plain definition.

`_prefix._cuts` writes the rule once, as two regular expressions, and finds
cuts with them: `_piece_at_least`, and `_pieces`, the cuts prefix
tokenization tries, which `read_bound` prices a truncated text by on
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
from offload_vllm._prefix import _cuts

WHITESPACE = " \t\n\r"

#: Letters and digits of several scripts, the underscore (`\w` but no letter),
#: punctuation, ASCII whitespace and non-ASCII spaces (no safe cut).
texts = st.text(alphabet=st.sampled_from("ab1_,.é٣ \t\n\r\u00a0\u3000漢\u0e33\uff9e"), max_size=400)


def position(data: st.DataObject, text: str) -> int:
    """A position in `text`, or just outside it."""
    return data.draw(st.integers(-2, len(text) + 2))


def cuttable(ch: str) -> bool:
    return ch.isalnum() and ch not in _cuts.GRAPHEME_JOINED


def prefix_ends(text: str) -> list[int]:
    return [i for i in range(1, len(text)) if text[i] in WHITESPACE and cuttable(text[i - 1])]


def suffix_starts(text: str) -> list[int]:
    return [i for i in range(1, len(text)) if text[i - 1] in WHITESPACE and cuttable(text[i])]


def piece_ends(text: str, side: str) -> list[int]:
    """The lengths of every piece `_prefix` may cut from `side`, shortest first."""
    n = len(text)
    return prefix_ends(text) if side == "right" else sorted(n - i for i in suffix_starts(text))


@given(texts, st.data(), st.sampled_from(["right", "left"]))
def test_the_next_piece_is_the_shortest_safe_cut_in_range(text: str, data: st.DataObject, side: str) -> None:
    count = data.draw(st.integers(0, 40))
    reach = _cuts._reach(text, count, side)  # type: ignore[arg-type]
    at = data.draw(st.integers(-2, len(text) + 2))
    within = [e for e in piece_ends(text, side) if at <= e <= reach.limit]
    assert _cuts._piece_at_least(reach, at) == (within[0] if within else None)


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
    ends = piece_ends(text, side)
    with mock.patch.multiple(_cuts, _CHARS_PER_TOKEN=guess[0], _MIN_CHARS=guess[1]):
        reach = _cuts._reach(text, count, side)  # type: ignore[arg-type]
        lengths = list(_cuts._pieces(reach, count))
        sure = _cuts._sure_piece(reach, count)
        bound = _prefix.read_bound(text, count)
    first = max(guess[1], (count + 1) * guess[0])
    limit = min(n // 3, _cuts._WINDOW * first)
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


def test_a_cut_past_the_window_is_never_taken() -> None:
    """After one 10,000-character word no piece is cut (from either end):
    the text is tokenized whole, never a piece past four first guesses; one
    within them is; and none in a text with no whitespace at all."""
    text = "word " + "x" * 10_000 + " tail " + "y" * 40_000
    right, left = _cuts._reach(text, 0, "right"), _cuts._reach(text[::-1], 0, "left")
    assert right.limit == left.limit == 4 * 64
    assert _cuts._piece_at_least(right, 5) is None
    assert _cuts._piece_at_least(left, 5) is None
    assert _cuts._piece_at_least(_cuts._reach("x" * 50_000, 0, "left"), 1) is None
    near = "word " * 20 + "x" * 10_000
    assert _cuts._piece_at_least(_cuts._reach(near, 0, "right"), 64) == 64


def test_no_cut_splits_a_grapheme_cluster() -> None:
    """Thai sara am joins the cluster of the space before it: a suffix
    starting at it would be normalized by a character map as a cluster of
    its own, where the whole text's cluster holds the space (an nmt_nfkc map
    then drops the combining mark after it in the suffix alone)."""
    text = "word a \u0e33\u0301 b " + "x" * 20
    assert suffix_starts(text) == [text.index("a "), text.index("b "), text.index("x")]
    pieces = {_cuts._piece_at_least(_cuts._reach(text, 0, "left"), at) for at in range(len(text))}
    assert len(text) - text.index("\u0e33") not in pieces
