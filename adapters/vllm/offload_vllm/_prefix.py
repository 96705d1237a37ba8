"""Prefix tokenization: tokenize only as much of a truncated text as its kept tokens need.

vLLM tokenizes a whole text and then keeps `truncate_prompt_tokens` of its tokens
(or the model's length); this tokenizes a prefix of the text (a suffix when
truncating on the left) long enough to hold them, growing it (at least doubling)
when it is not, and gives exactly what whole-text tokenization gives once vLLM's
truncation is applied to both.

**Why a prefix gives the same tokens.** A Hugging Face fast tokenizer
normalizes the text, splits it into pre-tokens ("words"), tokenizes each
pre-token on its own, then adds special tokens. The prefix is cut at a *safe
cut*: between a letter or digit (`str.isalnum`, but the few in
`GRAPHEME_JOINED`) and an ASCII whitespace character (a suffix starts at such
a point, after the whitespace): always a grapheme cluster boundary. For the
normalizers and pre-tokenizers in `_NORMALIZERS` and `_PRE_TOKENIZERS`:

- normalization is per character, or Unicode normalization, which an ASCII
  whitespace character (a starter that never composes) cannot join across, or a
  replacement of one character or of a run of spaces, which a letter or digit
  ends, or SentencePiece's character map (`Precompiled`, XLM-R's), which
  rewrites each grapheme cluster on its own (the tokenizers library's
  `Precompiled::normalize`): so the prefix normalizes to the start of what
  the whole text does, up to its last pre-token;
- pre-tokenization splits on whitespace, on punctuation, on digits or by the
  GPT-2 pattern (whose matches end where a class of characters does, or one
  whitespace character before a non-whitespace one): every pre-token of the
  prefix but its last is a pre-token of the whole text (of a suffix, every one
  but its first, which may carry a prepended space or `▁`);
- so every token from those pre-tokens is the whole text's token, in order.

The tokens kept are taken only from those pre-tokens ("stable" tokens: their
word index, `BatchEncoding.word_ids`, is below the prefix's last, above a
suffix's first), and the prefix is grown until one more stable token than vLLM
can keep exists, so that truncation of the prefix's tokens and of the text's
takes the same branch and the same tokens.

**What it costs, at most** (`_pieces`, `read_bound`). The pieces tried end
at safe cuts, each at least twice as long as the one before, the first at
a first guess of characters per token, none past a third of the text nor
past `_WINDOW` first guesses; they stop at the *sure piece*, the one that
ends past `keep + 2` letters or digits each followed by whitespace, which
holds enough stable tokens because every pre-token gives a token
(`_every_word_gives_a_token`). When the pieces run out, the whole text is
tokenized. So the characters handed to the tokenizer are at most the
text's length for the pieces plus the text once: **at most twice
whole-text tokenization, whatever the text**, in a few calls; and exactly
`read_bound` in the worst case, which a truncated text is priced by
(`_cost.py`) and which the pieces, taken from the priced count, never pass.
A text the tokenizer refuses (a lone surrogate) is tokenized whole, so that
it is refused as vLLM refuses it.

**Where it is not used** (whole-text tokenization, as vLLM does): a slow
(Python) tokenizer, or one whose backend is not the tokenizers library's; a
normalizer, pre-tokenizer or model not known above (such as a `Split`
pattern, BPE dropout), or a character map that makes a letter or digit
whitespace or nothing; a model that may give a word no token (no unknown token, no byte
fallback); an added token containing whitespace, or matched on the
normalized text by a form that holds what a cut's whitespace normalizes to
(or with a normalizer that removes that whitespace); special tokens anywhere
but before and after the text; a text with no safe cut. Each tokenizer is
checked once (`plan`); a text is checked as it is tokenized.

**Text pairs** (a cross-encoder's query and document, `encode_pair_truncated`)
are cut by the same argument applied to the document: at the end of this module.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import sys
import threading
import weakref
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Side = Literal["left", "right"]

#: Normalizers that keep a safe cut safe, with the settings they must have.
_NORMALIZERS: dict[str, Callable[[Mapping[str, Any]], bool]] = {
    "BertNormalizer": lambda n: True,
    "Lowercase": lambda n: True,
    "NFC": lambda n: True,
    "NFD": lambda n: True,
    "NFKC": lambda n: True,
    "NFKD": lambda n: True,
    "StripAccents": lambda n: True,
    "Nmt": lambda n: True,
    "Strip": lambda n: True,
    "Prepend": lambda n: True,
    # SentencePiece's character map: it rewrites each grapheme cluster on its
    # own, and a cut is a cluster boundary (`GRAPHEME_JOINED`).
    "Precompiled": lambda n: True,
    # One character for another (SentencePiece's " " -> "▁"), or a run of spaces
    # for one (SentencePiece's collapsing of spaces).
    "Replace": lambda n: n.get("pattern") in ({"String": " "}, {"Regex": " {2,}"})
    or (isinstance((pat := n.get("pattern", {})).get("String"), str) and len(pat["String"]) == 1 and not pat["String"].isalnum()),
}

#: Pre-tokenizers for which every pre-token of a prefix but the last is the whole text's.
_PRE_TOKENIZERS: dict[str, Callable[[Mapping[str, Any]], bool]] = {
    "BertPreTokenizer": lambda p: True,
    "Whitespace": lambda p: True,
    "WhitespaceSplit": lambda p: True,
    "Punctuation": lambda p: True,
    "Digits": lambda p: True,
    "ByteLevel": lambda p: p.get("use_regex", True) is True,
    "Metaspace": lambda p: p.get("split", True) is True,
}

_MODELS: dict[str, Callable[[Mapping[str, Any]], bool]] = {
    "WordPiece": lambda m: True,
    "BPE": lambda m: m.get("dropout") in (None, 0, 0.0),
    "Unigram": lambda m: True,
    "WordLevel": lambda m: True,
}


def _components_known(part: Mapping[str, Any] | None, known: Mapping[str, Callable[[Mapping[str, Any]], bool]]) -> bool:
    if part is None:
        return True
    kind = part.get("type")
    if kind == "Sequence":
        items = part.get("normalizers", part.get("pretokenizers"))
        return isinstance(items, list) and all(_components_known(item, known) for item in items)
    check = known.get(str(kind))
    return check is not None and check(part)


def unsound_because(tokenizer: Any) -> str | None:
    """Why prefix tokenization could give other tokens than the whole text's
    with `tokenizer` (a `transformers` tokenizer), or `None` when it cannot."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not getattr(tokenizer, "is_fast", False):
        return "not a fast (Rust) tokenizer"
    import tokenizers

    if not isinstance(backend, tokenizers.Tokenizer):
        # vLLM's `VLLM_USE_FASTOKENS=1` swaps in fastokens' shim: its word
        # indices and normalization are not the ones argued for here.
        return f"its backend is {type(backend).__module__}.{type(backend).__name__}, not the tokenizers library's"
    try:
        spec = json.loads(backend.to_str())
    except Exception as exc:  # an unexpected backend: whole-text tokenization
        return f"its description could not be read ({exc!r})"
    if not _components_known(spec.get("normalizer"), _NORMALIZERS):
        return f"normalizer {spec.get('normalizer')!r} is not one known to keep a cut"
    if spec.get("pre_tokenizer") is None:
        return "no pre-tokenizer: the whole text is one pre-token"
    if not _components_known(spec.get("pre_tokenizer"), _PRE_TOKENIZERS):
        return f"pre-tokenizer {spec.get('pre_tokenizer')!r} is not one known to keep a cut"
    if not _components_known(spec.get("model"), _MODELS):
        return f"model {spec.get('model', {}).get('type')!r} with these settings is not known to tokenize per pre-token"
    if not _every_word_gives_a_token(spec.get("model") or {}, spec.get("pre_tokenizer")):
        return "a word may give no token (no unknown token, no byte fallback)"
    normalizer = getattr(backend, "normalizer", None)
    described = json.dumps(spec.get("normalizer"))
    if "Precompiled" in described and (gone := _letters_removed(described, normalizer)):
        return f"the normalizer makes {gone!r} no letter or digit: a word may give no token"
    # What a cut's whitespace becomes, between two letters: what an added
    # token matched on the normalized text must not hold, or it could match
    # across the cut.
    marks = {ch: _between_letters(normalizer, ch) for ch in " \t\n\r"}
    for added in spec.get("added_tokens") or ():
        content = str(added.get("content", ""))
        if any(ch.isspace() for ch in content):
            return f"added token {content!r} contains whitespace"
        if normalizer is None or not added.get("normalized"):
            continue
        form = normalizer.normalize_str(content)
        if any(ch.isspace() or any(ch in mark for mark in marks.values()) for ch in form):
            return f"added token {content!r} normalizes to {form!r}, which a cut's whitespace may be part of"
        if any(mark == "" for mark in marks.values()):
            return f"the normalizer removes whitespace, across which added token {content!r} may match"
    return None


#: `_letters_removed` by normalizer description: once per map, not per tokenizer copy.
_removed: dict[str, str] = {}


def _letters_removed(description: str, normalizer: Any) -> str:
    """The letters and digits (up to 5) that `normalizer` (described by
    `description`) makes whitespace or nothing, which could leave a word
    with no token (a character map may). ~0.6 s: Unicode's 133,000 letters
    and digits, each alone."""
    if description not in _removed:
        letters = (chr(c) for c in range(sys.maxunicode + 1) if chr(c).isalnum())
        gone = (ch for ch in letters if not normalizer.normalize_str(ch).strip())
        _removed[description] = "".join(itertools.islice(gone, 5))
    return _removed[description]


def _between_letters(normalizer: Any, whitespace: str) -> str:
    """What `normalizer` makes of `whitespace` between two letters (`a`)."""
    if normalizer is None:
        return whitespace
    head = str(normalizer.normalize_str("a"))
    both = str(normalizer.normalize_str("a" + whitespace + "a"))
    return both[len(head) : -1] if both.startswith(head) and both.endswith("a") else both


def _every_word_gives_a_token(model: Mapping[str, Any], pre_tokenizer: Mapping[str, Any] | None) -> bool:
    """Whether every pre-token gives at least one token: the model has an
    unknown token (or byte fallback, or byte-level BPE's every byte), so
    that no character is dropped. What bounds the pieces tried
    (`_sure_piece`), and so the price of a truncated text."""
    kind = model.get("type")
    vocab = model.get("vocab")
    if model.get("byte_fallback"):
        return True
    if kind == "Unigram":
        return model.get("unk_id") is not None
    unk = model.get("unk_token")
    if isinstance(vocab, dict) and unk is not None and unk in vocab:
        return True
    if kind != "BPE" or not isinstance(vocab, dict) or not _byte_level(pre_tokenizer):
        return False
    from tokenizers.pre_tokenizers import ByteLevel

    return set(ByteLevel.alphabet()) <= vocab.keys()


def _byte_level(part: Mapping[str, Any] | None) -> bool:
    if part is None:
        return False
    if part.get("type") == "Sequence":
        return any(_byte_level(item) for item in part.get("pretokenizers") or ())
    return part.get("type") == "ByteLevel"


@dataclass(frozen=True)
class Plan:
    """How one tokenizer is tokenized by prefix, or `reason` why it is not."""

    reason: str | None


_plans: weakref.WeakKeyDictionary[Any, Plan] = weakref.WeakKeyDictionary()
_plans_lock = threading.Lock()
_logged: set[tuple[str, str | None]] = set()
logger = logging.getLogger("vllm.offload_vllm")


def _announce(tokenizer: Any, found: Plan) -> None:
    """Say once per process and kind of tokenizer whether truncated texts are tokenized by prefix."""
    key = (type(tokenizer).__name__, found.reason)
    if key in _logged:
        return
    _logged.add(key)
    if found.reason is None:
        logger.info("offload-vllm: prefix tokenization on for %s", key[0])
    else:
        logger.info("offload-vllm: prefix tokenization off for %s (%s): whole texts are tokenized", key[0], found.reason)


def plan(tokenizer: Any) -> Plan:
    """`tokenizer`'s plan, checked once per tokenizer object."""
    try:
        found = _plans.get(tokenizer)
    except TypeError:  # not weakly referenceable: check each time
        return Plan(unsound_because(tokenizer))
    if found is None:
        found = Plan(unsound_because(tokenizer))
        with _plans_lock:
            _plans[tokenizer] = found
            _announce(tokenizer, found)
    return found


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


def read_bound(text: str, count: int) -> int:
    """The most characters `encode_truncated` hands the tokenizer for `text`
    when vLLM keeps at most `count` tokens of it, from either side (what a
    truncated text is priced by): every piece it may try, then the whole
    text where the pieces may not be enough. At most twice the text's length.
    Scans at most `2 * _WINDOW * max(_MIN_CHARS, 6 * (count + 1))` characters
    (and two thirds of the text): this runs on the event loop, per text."""
    bound = 0
    for side in _SIDES:
        read, sure = _piece_reads(text, count, side)
        bound = max(bound, read + (0 if sure else len(text)))
    return bound


_SIDES: tuple[Side, ...] = ("right", "left")


def _piece_reads(text: str, count: int, side: Side) -> tuple[int, bool]:
    """The characters of every piece `encode_truncated` may try on `side`, and
    whether those pieces end at the sure piece (else the whole text follows)."""
    pieces = _pieces(_reach(text, count, side), count)
    read = 0
    try:
        while True:
            read += next(pieces)
    except StopIteration as end:  # its value: whether the pieces end at the sure piece
        return read, bool(end.value)


def _stable(encoding: Any, index: int, need: int, side: Side) -> bool | None:
    """Whether the piece's encoding holds `need` stable content tokens; `None`
    when its special tokens are not all before and after the text."""
    sequence_ids = encoding.sequence_ids(index)
    word_ids = encoding.word_ids(index)
    content = [w for s, w in zip(sequence_ids, word_ids, strict=True) if s is not None]
    first = next((i for i, s in enumerate(sequence_ids) if s is not None), len(sequence_ids))
    if any(s is None for s in sequence_ids[first : first + len(content)]):
        return None
    if any(w is None for w in content):
        return None
    if len(content) < need:
        return False
    if side == "right":
        last = max(content)
        return bool(content[need - 1] < last)
    first_word = min(content)
    return bool(content[-need] > first_word)




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


def encode_truncated(
    tokenizer: Any,
    texts: Sequence[str],
    encode_kwargs: Mapping[str, Any],
    keep: int,
    side: Side,
    priced: int | None = None,
) -> list[list[int]] | None:
    """`tokenizer(texts, **encode_kwargs)["input_ids"]`, as vLLM's truncation to at
    most `keep` tokens from `side` leaves them: the ids to hand to vLLM, which
    then truncates them exactly as it would the whole texts' (to the same ids).

    `encode_kwargs` are vLLM's (`TokenizeParams.get_encode_kwargs`); `keep` is the
    most tokens vLLM can keep: the least of its truncation length and the
    tokenizer's `max_length`, when it truncates. `priced`: the token count the
    texts were priced by (`read_bound`; at least `keep`), whose pieces are
    tried, so that no text is read past its price. `None` when `tokenizer` is
    not one prefix tokenization is sound for (`plan`): tokenize the whole texts.

    Hands the tokenizer at most `read_bound(text, priced or keep)` characters
    of each text: at most twice its length, in at most a few calls per text."""
    if plan(tokenizer).reason is not None or keep < 0:
        return None
    count = keep if priced is None or priced < keep else priced
    # One more stable content token than can be kept: truncation takes the same branch.
    need = keep + 1
    plain = {k: v for k, v in encode_kwargs.items() if k not in ("truncation", "max_length")}
    results: list[list[int] | None] = [None] * len(texts)
    whole: list[int] = []
    # Per text being tokenized by pieces: the pieces left to try, and the one tried now.
    schedules: dict[int, Generator[int, None, bool]] = {}
    trying: dict[int, int] = {}
    for i, text in enumerate(texts):
        # A text the tokenizer refuses is refused whole, as vLLM refuses it.
        if not _encodable(text):
            whole.append(i)
            continue
        schedules[i] = _pieces(_reach(text, count, side), count)
    while schedules:
        for i in list(schedules):
            length = next(schedules[i], None)
            if length is None:
                whole.append(i)
                del schedules[i]
            else:
                trying[i] = length
        if not schedules:
            break
        todo = list(schedules)
        pieces = [texts[i][: trying[i]] if side == "right" else texts[i][len(texts[i]) - trying[i] :] for i in todo]
        encoding = tokenizer(pieces, truncation=False, **plain)
        for j, i in enumerate(todo):
            stable = _stable(encoding, j, need, side)
            if stable is None:
                whole.append(i)
            elif stable:
                results[i] = _as_truncated(encoding, j, encode_kwargs, side)
            else:
                continue
            del schedules[i]
    if whole:
        ids = tokenizer([texts[i] for i in sorted(whole)], **encode_kwargs)["input_ids"]
        for i, one in zip(sorted(whole), ids, strict=True):
            results[i] = list(one)
    return [r if r is not None else [] for r in results]


def _as_truncated(encoding: Any, index: int, encode_kwargs: Mapping[str, Any], side: Side) -> list[int]:
    """The piece's ids as the tokenizer's own truncation (`truncation=True,
    max_length=L`) would give them: `L` less the special tokens content tokens,
    from `side`, between the special tokens. Where the special tokens alone
    exceed `L` the tokenizer does not truncate, and neither does this."""
    ids = list(encoding["input_ids"][index])
    if not encode_kwargs.get("truncation") or encode_kwargs.get("max_length") is None:
        return ids
    sequence_ids = encoding.sequence_ids(index)
    lead = next(i for i, s in enumerate(sequence_ids) if s is not None)
    count = sum(1 for s in sequence_ids if s is not None)
    added = len(ids) - count
    room = int(encode_kwargs["max_length"]) - added
    if room < 0:
        return ids
    content = ids[lead : lead + count]
    kept = content[:room] if side == "right" else content[len(content) - room :]
    return ids[:lead] + kept + ids[lead + count :]


# ---- text pairs (a cross-encoder's query and document) ---------------------
#
# vLLM tokenizes a scoring pair with one call, `tokenizer(text=query,
# text_pair=document, **encode_kwargs)` (`CrossEncoderIOProcessor.get_score_prompt`),
# then cuts the output as it cuts a single text's (`_truncation_slice`). Where
# the call truncates (`truncation=True, max_length=M`), the tokenizers library
# cuts the pair *longest first* before adding special tokens: how many tokens
# each side keeps depends on the document's length only up to a threshold
# (`_pair_kept`), so a prefix of the document with that many stable tokens
# (`_stable`) gives the same ids. Where it does not (an explicit
# `truncation_side`, or `M` below the special tokens), vLLM keeps `keep`
# tokens of the whole output from a side: the query and a prefix of the
# document with enough stable tokens to fill them give the same.


def _pair_kept(query: int, document: int, room: int) -> tuple[int, int]:
    """The tokens each side of a pair keeps under longest-first truncation to
    `room` content tokens (`max_length` less the pair's special tokens): the
    tokenizers library's `truncate_encodings`, `TruncationStrategy::LongestFirst`."""
    if query + document <= room:
        return query, document
    swap = query > document
    shorter, longer = (document, query) if swap else (query, document)
    longer = shorter if shorter > room else max(shorter, room - shorter)
    if shorter + longer > room:
        shorter, longer = room // 2, room // 2 + room % 2
    return (longer, shorter) if swap else (shorter, longer)


def _pair_threshold(query: int, room: int) -> int:
    """The least document length from which `_pair_kept(query, ·, room)` no
    longer changes: a document known to hold this many tokens is cut as the
    whole one is."""
    if 2 * query <= room:
        return max(room - query, 1)
    if query > room and room % 2 == 0:
        # Past half the room, either side of `query`, each keeps half.
        return room // 2 + 1
    return max(query, room - query + 1)


def pair_read_bound(query: str, document: str, count: int) -> int:
    """The most characters `encode_pair_truncated` hands the tokenizer for the
    pair when vLLM keeps at most `count` tokens of it (`truncate_prompt_tokens`),
    from either side, including vLLM's whole-pair tokenization where it gives
    up: the query and the first piece in one call, each further piece alone,
    and the whole pair where the pieces may not be enough. That is where the
    pieces run out (`read_bound`), and where the query may hold more tokens
    than `count` (`_may_outgrow`: where `_pair_threshold` may pass the sure
    piece). At most twice the pair's length."""
    return pair_read_bounds(query, document, count)[0]


def pair_read_bounds(query: str, document: str, count: int) -> tuple[int, int]:
    """`pair_read_bound(query, document, count)` and `read_bound(document,
    count)`, the document's pieces on each side found once: pricing a pair
    takes both (a cross-encoder's and a bi-encoder's reads)."""
    reads = [_piece_reads(document, count, side) for side in _SIDES]
    alone = max(read + (0 if sure else len(document)) for read, sure in reads)
    whole = len(query) + len(document)
    if not (query and document and _encodable(query) and _encodable(document)):
        return whole, alone  # tokenized whole (`encode_pair_truncated`)
    grows = _may_outgrow(query, count)
    bound = 0
    for read, sure in reads:
        read += len(query) if read else 0
        read += whole if grows or not sure else 0
        bound = max(bound, read)
    return bound, alone


#: More than the tokens per character of an ASCII query, besides three (a
#: prepended `▁`): every model's token covers at least one byte of the
#: normalized, pre-tokenized text, where a tokenizer the pair path is on for
#: makes an ASCII character at most three bytes (`_pair_unsound_because`; `▁` is three).
_ASCII_TOKENS_PER_CHAR = 4


def _may_outgrow(query: str, count: int) -> bool:
    """Whether `query` may hold more than `count` tokens (judged from its
    characters: pricing has no tokenizer): then `_pair_threshold` may pass
    the sure piece, and the pair is priced as tokenized whole besides."""
    return not (query.isascii() and _ASCII_TOKENS_PER_CHAR * len(query) + 3 <= count)


_POST_PROCESSORS = {"TemplateProcessing", "BertProcessing", "RobertaProcessing", "ByteLevel"}


def _pair_unsound_because(tokenizer: Any) -> str | None:
    """Why the pair path could give other ids than vLLM's whole pair with
    `tokenizer` (beyond `unsound_because`), or `None`: a post-processor
    whose special tokens depend on the text, or a normalizer that makes an
    ASCII character more than three bytes (`_may_outgrow`)."""
    backend = tokenizer.backend_tokenizer
    spec = json.loads(backend.to_str())
    processor = spec.get("post_processor")
    parts = [] if processor is None else processor.get("processors", [processor])
    unknown = [p.get("type") for p in parts if p.get("type") not in _POST_PROCESSORS]
    if unknown:
        return f"post-processor {unknown[0]!r} is not one known to add the same special tokens to any pair"
    normalizer = backend.normalizer
    if normalizer is not None:
        wide = [chr(c) for c in range(128) if len(normalizer.normalize_str(chr(c)).encode()) > 3]
        if wide:
            return f"the normalizer makes {wide[0]!r} more than three bytes"
    return None


_pair_plans: weakref.WeakKeyDictionary[Any, Plan] = weakref.WeakKeyDictionary()


def pair_plan(tokenizer: Any) -> Plan:
    """`tokenizer`'s plan for pairs (`plan`, then `_pair_unsound_because`), checked once per tokenizer object."""
    single = plan(tokenizer)
    if single.reason is not None:
        return single
    try:
        found = _pair_plans.get(tokenizer)
    except TypeError:
        return Plan(_pair_unsound_because(tokenizer))
    if found is None:
        found = Plan(_pair_unsound_because(tokenizer))
        with _plans_lock:
            _pair_plans[tokenizer] = found
    return found


@dataclass(frozen=True)
class _Layout:
    """Where a pair's encoding holds its query and its document."""

    query: slice
    document: slice


def _layout(encoding: Any) -> _Layout | None:
    """The spans of the query (sequence 0) and document (sequence 1) in a
    pair's encoding, each contiguous and every content token from a word;
    `None` otherwise (tokenize the whole pair)."""
    sequence_ids = list(encoding.sequence_ids(0))
    word_ids = encoding.word_ids(0)
    spans: list[slice] = []
    # `list.count` and `index` rather than a Python loop over the tokens: this runs per pair.
    for sequence in (1, 0):
        tokens = sequence_ids.count(sequence)
        if not tokens and sequence == 0:  # a query of no tokens (whitespace): just before the document's specials
            at_document = spans[0].start
            spans.append(slice(at_document, at_document))
            continue
        if not tokens:
            return None
        span = slice(start := sequence_ids.index(sequence), start + tokens)
        if sequence_ids[span].count(sequence) != tokens or None in word_ids[span]:
            return None  # not contiguous, or a content token from no word
        spans.append(span)
    document, query = spans
    if query.stop > document.start:
        return None
    return _Layout(query, document)


def _stable_words(word_ids: Sequence[int], side: Side) -> int:
    """How many of a piece's content tokens (their `word_ids`) are stable,
    counted from `side`: all but those of its last word (a suffix: its first)."""
    if not word_ids:
        return 0
    edge = max(word_ids) if side == "right" else min(word_ids)
    return len(word_ids) - word_ids.count(edge)


def encode_pair_truncated(
    tokenizer: Any,
    query: str,
    document: str,
    encode_kwargs: Mapping[str, Any],
    keep: int | None,
    slice_side: Side,
    count: int | None,
) -> dict[str, list[int]] | None:
    """`tokenizer(text=query, text_pair=document, **encode_kwargs)`'s
    `input_ids` and `token_type_ids` (where it gives them), or ids that
    vLLM's cut of a pair's output (`keep` tokens from `slice_side`; `None`:
    no cut) leaves exactly as it leaves those: the ids to hand to vLLM.

    `count`: the token count the pair was priced by (`pair_read_bound`),
    whose pieces are tried; `None`: the most tokens vLLM keeps. `None`
    (tokenize the whole pair) where the pair path is not sound for
    `tokenizer` (`pair_plan`), for an empty side, a text the tokenizer
    refuses, or a pair the pieces do not settle. Hands the tokenizer at most
    what `pair_read_bound` counts, less the whole pair where it gives up."""
    if pair_plan(tokenizer).reason is not None or not query or not document:
        return None
    if not (_encodable(query) and _encodable(document)):
        return None
    special = bool(encode_kwargs.get("add_special_tokens", True))
    max_length = encode_kwargs.get("max_length") if encode_kwargs.get("truncation") else None
    if max_length is None and keep is None:
        return None  # nothing is cut: the whole document is kept
    truncating = max_length is not None
    side: Side = slice_side
    if truncating:
        side = "left" if tokenizer.truncation_side == "left" else "right"
    most = int(max_length) if max_length is not None else int(keep or 0)
    schedule = _pieces(_reach(document, count if count is not None else most, side), count if count is not None else most)
    length = next(schedule, None)
    if length is None:
        return None
    piece = document[:length] if side == "right" else document[len(document) - length :]
    first = tokenizer(query, piece, truncation=False, add_special_tokens=special)
    layout = _layout(first)
    if layout is None:
        return None
    ids = list(first["input_ids"])
    types = first.get("token_type_ids")
    type_ids = None if types is None else list(types)
    if type_ids is not None and len(set(type_ids[layout.document])) != 1:
        return None
    queried = layout.query.stop - layout.query.start
    lead, between, tail = layout.query.start, layout.document.start - layout.query.stop, len(ids) - layout.document.stop
    room = 0
    if max_length is not None:
        room = int(max_length) - (lead + between + tail) if special else int(max_length)
        if room < 0:  # special tokens past `max_length`: the tokenizer does not cut
            if keep is None:
                return None
            if side != slice_side:
                return None
            truncating = False
    if truncating:
        need = _pair_threshold(queried, room)
        kept_query, kept_document = _pair_kept(queried, need, room)
    else:
        assert keep is not None
        before = lead + queried + between if side == "right" else tail
        kept_query, kept_document = queried, max(0, keep - before) + 1
        need = kept_document
    words = list(first.word_ids(0)[layout.document])
    document_ids = ids[layout.document]
    while _stable_words(words, side) < need:
        length = next(schedule, None)
        if length is None:
            return None
        piece = document[:length] if side == "right" else document[len(document) - length :]
        alone = tokenizer(piece, truncation=False, add_special_tokens=False)
        words = [w for w in alone.word_ids(0) if w is not None]
        document_ids = list(alone["input_ids"])
        if len(words) != len(document_ids):
            return None
    query_ids = ids[layout.query]
    cut = slice(0, kept_query) if side == "right" else slice(queried - kept_query, queried)
    cut_document = slice(0, kept_document) if side == "right" else slice(len(document_ids) - kept_document, None)
    out = {"input_ids": ids[:lead] + query_ids[cut] + ids[layout.query.stop : layout.document.start] + document_ids[cut_document] + ids[layout.document.stop :]}
    if type_ids is not None:
        document_type = type_ids[layout.document.start]
        out["token_type_ids"] = (
            type_ids[:lead] + type_ids[layout.query][cut] + type_ids[layout.query.stop : layout.document.start]
            + [document_type] * kept_document + type_ids[layout.document.stop :]
        )
    return out
