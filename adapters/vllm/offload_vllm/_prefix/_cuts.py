"""Where a text may be cut: safe cuts (`_SAFE_CUT`, `GRAPHEME_JOINED`), and the
pieces tried in order (`_pieces`), from a first guess of characters per
token up to the sure piece, within a window of the text's end."""

from __future__ import annotations

import itertools
import re
from collections.abc import Generator
from dataclasses import dataclass
from typing import Literal

Side = Literal["left", "right"]


#: First guess of characters per kept token; a wrong guess costs only a regrowth.
_CHARS_PER_TOKEN = 6


_MIN_CHARS = 64


#: A piece ends within this many first guesses of its end of the text (and
#: within a third of the text): 24 characters a kept token, four English
#: words with their spaces. A text with no place to stop there is tokenized
#: whole. It bounds what pricing scans of a text on the event loop.
_WINDOW = 4


#: The letters and digits that join a grapheme cluster with the whitespace
#: beside them (Unicode's grapheme break property Prepend, Extend, SpacingMark:
#: Thai ำ, halfwidth katakana's sound marks, ...): no cut is made next to them,
#: so that every cut is a cluster boundary, which a normalizer that rewrites
#: clusters (`Precompiled`) cannot rewrite across.
GRAPHEME_JOINED = "\u0d4e\u0e33\u0eb3\uff9e\uff9f\U000111c2\U000111c3\U0001193f\U00011941" + "".join(
    chr(c) for c in (0x11A84, 0x11A85, 0x11A86, 0x11A87, 0x11A88, 0x11A89, 0x11D46)
)


# The safe-cut rule, in one place: a letter or digit (but those above) next to
# ASCII whitespace. `[^\W_]` is exactly `str.isalnum` (`\w` is it plus the underscore).
#: A letter or digit, then the whitespace a prefix ends before (read
#: backwards: the whitespace a suffix starts after, then its first letter or digit).
_SAFE_CUT = re.compile(r"[^\W_" + GRAPHEME_JOINED + r"][ \t\n\r]")
#: The same cuts, each matched at its whitespace (a piece ends at `start()`):
#: `re` skips to whitespace at C speed before it looks at a letter, where
#: `_SAFE_CUT` tries every character (~1.6x as long on multilingual text).
_SAFE_CUT_AT_SPACE = re.compile(r"[ \t\n\r](?<=[^\W_" + GRAPHEME_JOINED + r"][ \t\n\r])")


#: An ASCII character's class for `_sure_piece`: `a` a letter or digit, a
#: space ASCII whitespace, `.` anything else (a safe cut reads `a `).
_ASCII_CLASSES = bytes(
    ord("a") if chr(b).isalnum() else ord(" ") if chr(b) in " \t\n\r" else ord(".") for b in range(256)
)


@dataclass(frozen=True)
class _Reach:
    """Where the pieces of one text, from one side, may end."""

    #: The side read from its end: the text (prefixes), or the last
    #: `limit + 1` characters reversed (suffixes, where a safe start reads as
    #: a safe cut). A piece of length `k` ends at a safe cut `view[k - 1: k + 1]`.
    view: str
    #: The longest piece: at most a third of the text, and `_WINDOW` first guesses.
    limit: int
    #: The first piece is at least this long: a first guess of characters per token.
    first: int


def _reach(text: str, count: int, side: Side) -> _Reach:
    """Pieces of `text` for keeping `count` tokens from `side`."""
    first = max(_MIN_CHARS, (count + 1) * _CHARS_PER_TOKEN)
    limit = min(len(text) // 3, _WINDOW * first)
    view = text if side == "right" else text[len(text) - limit - 1 :][::-1]
    return _Reach(view, limit, first)


def _piece_at_least(reach: _Reach, length: int) -> int | None:
    """The shortest piece at least `length` long, or None past the limit."""
    start, end = max(length, 1) - 1, reach.limit + 1
    # `str.find` passes a stretch with no whitespace (one long word) many
    # times faster than `re`, which takes ~20 ns a character: this prices texts on the loop.
    spaces = [at for at in (reach.view.find(space, start + 1, end) for space in " \t\n\r") if at >= 0]
    if not spaces:
        return None
    found = _SAFE_CUT.search(reach.view, min(spaces) - 1, end)
    return None if found is None else found.start() + 1


def _sure_piece(reach: _Reach, count: int) -> int | None:
    """The shortest piece ending past `count + 2` letters or digits each
    followed by whitespace, or None past the limit. Each is the last
    character of a pre-token of its own, which gives at least one token
    (`_every_word_gives_a_token`), all but the last's stable: the piece
    holds `count + 1` stable tokens, one more than can be kept."""
    end = reach.limit + 1
    if not reach.view.isascii():
        found = next(itertools.islice(_SAFE_CUT_AT_SPACE.finditer(reach.view, 0, end), count + 1, None), None)
        return None if found is None else found.start()
    # ASCII (`isascii` is O(1)): each character as its class, where a safe cut
    # reads `a `; `bytes.split` finds them at memory speed, where `re` takes
    # ~45 ns a character: this prices texts on the loop.
    classes = reach.view[:end].encode("ascii").translate(_ASCII_CLASSES)
    parts = classes.split(b"a ", count + 2)
    if len(parts) < count + 3:
        return None
    # The rest follows the last of them, whose letter ends the piece.
    return len(classes) - len(parts[-1]) - 1


def _holds_sure(reach: _Reach, count: int, length: int) -> bool:
    """Whether the piece of `length` (at most the limit) is at least the sure
    piece (`_sure_piece`), reading only the piece: for an ASCII one, its
    safe cuts counted at memory speed (pricing asks this of every text on
    the loop; finding where the sure piece ends reads up to the limit)."""
    view = reach.view[: length + 1]
    if not view.isascii():
        return len(_SAFE_CUT_AT_SPACE.findall(view)) >= count + 2
    return view.encode("ascii").translate(_ASCII_CLASSES).count(b"a ") >= count + 2


def _pieces(reach: _Reach, count: int) -> Generator[int, None, bool]:
    """The lengths of the pieces to tokenize, in order, while none holds
    enough stable tokens; when they run out, the text is tokenized whole.
    Returns whether the last was the sure piece.

    Each is a safe cut at least twice as long as the one before, the last
    at most the sure piece (`_sure_piece`), none past the limit: together
    they are at most three sure pieces, and at most the text's length."""
    length = _piece_at_least(reach, reach.first)
    sure: int | None = None
    while length is not None:
        yield length
        if sure is None:
            if _holds_sure(reach, count, length):  # most texts: the first guess was long enough
                return True
            sure = _sure_piece(reach, count) or reach.limit + 1
        if length >= sure:
            return True
        longer = _piece_at_least(reach, 2 * length)
        length = sure if longer is None or longer > sure else longer
        if length > reach.limit:
            return False
    return False


def _encodable(text: str) -> bool:
    """Whether the tokenizer takes `text` at all: no lone surrogate (a JSON
    `\\ud800`), which it refuses (`TypeError`) wherever it is in the text."""
    if text.isascii():  # O(1): CPython keeps it
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
