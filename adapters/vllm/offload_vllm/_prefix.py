"""Prefix tokenization: tokenize only as much of a truncated text as its kept tokens need.

vLLM tokenizes a whole text and then keeps `truncate_prompt_tokens` of its tokens
(or the model's length); this tokenizes a prefix of the text (a suffix when
truncating on the left) long enough to hold them, growing it (doubling) when it
is not, and gives exactly what whole-text tokenization gives once vLLM's
truncation is applied to both.

**Why a prefix gives the same tokens.** A Hugging Face fast tokenizer
normalizes the text, splits it into pre-tokens ("words"), tokenizes each
pre-token on its own, then adds special tokens. The prefix is cut at a *safe
cut*: between a letter or digit (`str.isalnum`) and an ASCII whitespace character
(a suffix starts at such a point, after the whitespace). For the normalizers
and pre-tokenizers in `_NORMALIZERS` and `_PRE_TOKENIZERS`:

- normalization is per character, or Unicode normalization, which an ASCII
  whitespace character (a starter that never composes) cannot join across, or a
  replacement of one character or of a run of spaces, which a letter or digit
  ends: so the prefix normalizes to the start of what the whole text does;
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

**Where it is not used** (whole-text tokenization, as vLLM does): a slow
(Python) tokenizer; a normalizer, pre-tokenizer or model not known above (such
as SentencePiece's `Precompiled` character map, a `Split` pattern, BPE
dropout); an added token containing whitespace; special tokens anywhere but
before and after the text; a text with no safe cut. Each tokenizer is checked
once (`plan`); a text is checked as it is tokenized.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
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
    for added in spec.get("added_tokens") or ():
        if any(ch.isspace() for ch in str(added.get("content", ""))):
            return f"added token {added.get('content')!r} contains whitespace"
    return None


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

# The safe-cut rule, in one place: a letter or digit next to ASCII
# whitespace. `[^\W_]` is exactly `str.isalnum` (`\w` is it plus the underscore).
#: A letter or digit, then the whitespace a prefix ends before (read
#: backwards: the whitespace a suffix starts after, then its first letter or digit).
_SAFE_CUT = re.compile(r"[^\W_][ \t\n\r]")
#: Whitespace, then the letter or digit a suffix starts at.
_SAFE_START = re.compile(r"[ \t\n\r][^\W_]")

#: How far back `_cut_left` first looks; the window doubles while it finds nothing.
_BACK_WINDOW = 32


def _cut_right(text: str, at: int, last: int | None = None) -> int:
    """The first safe cut `i` (a prefix `text[:i]`) with `at <= i` and, unless
    `last` is None, `i <= last`; `len(text)` when there is none."""
    end = len(text) if last is None else min(len(text), last + 1)
    found = _SAFE_CUT.search(text, max(at, 1) - 1, end)
    return len(text) if found is None else found.start() + 1


def _cut_left(text: str, at: int, first: int = 1) -> int:
    """The last safe start `i` (a suffix `text[i:]`) with `first <= i <= at`,
    or 0 when there is none."""
    # `re` searches forwards only: search a window back from `at`, reversed
    # (where a safe start reads as a safe cut), and widen it (doubling) while
    # nothing is found, each window ending a character into the one before it
    # (a match is two long).
    floor = max(first, 1) - 1
    end = min(at, len(text) - 1) + 1
    width = _BACK_WINDOW
    while end - floor >= 2:
        start = max(floor, end - width)
        found = _SAFE_CUT.search(text[start:end][::-1])
        if found is not None:
            return end - 1 - found.start()
        end, width = start + 1, 2 * width
    return 0


def first_pieces_within(text: str, span: int, limit: int) -> bool:
    """Whether the first prefix and the first suffix `encode_truncated` cuts
    from `text` when trying `span` characters are each at most `limit` long:
    a safe cut in `[span, limit]` from the start, a safe start in
    `[len - limit, len - span]` from the end. False for a text with no safe cut
    there (one long word, no whitespace), which is read much further or whole.
    Reads at most `2 * limit` characters."""
    n = len(text)
    if n <= limit:
        return True
    # As `_cut_right(text, span) <= limit` and `_cut_left(text, n - span) >= n - limit`
    # say, but searching only those ranges: this runs on the event loop, per text.
    if span < 1 or _SAFE_CUT.search(text, span - 1, limit + 1) is None:
        return False
    return _SAFE_START.search(text, n - limit - 1, n - span + 1) is not None


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


def encode_truncated(
    tokenizer: Any,
    texts: Sequence[str],
    encode_kwargs: Mapping[str, Any],
    keep: int,
    side: Side,
) -> list[list[int]] | None:
    """`tokenizer(texts, **encode_kwargs)["input_ids"]`, as vLLM's truncation to at
    most `keep` tokens from `side` leaves them: the ids to hand to vLLM, which
    then truncates them exactly as it would the whole texts' (to the same ids).

    `encode_kwargs` are vLLM's (`TokenizeParams.get_encode_kwargs`); `keep` is the
    most tokens vLLM can keep: the least of its truncation length and the
    tokenizer's `max_length`, when it truncates. `None` when `tokenizer` is not
    one prefix tokenization is sound for (`plan`): tokenize the whole texts."""
    if plan(tokenizer).reason is not None or keep < 0:
        return None
    # One more stable content token than can be kept: truncation takes the same branch.
    need = keep + 1
    plain = {k: v for k, v in encode_kwargs.items() if k not in ("truncation", "max_length")}
    results: list[list[int] | None] = [None] * len(texts)
    # Per text: the characters tried so far (grows by doubling).
    span = [max(_MIN_CHARS, need * _CHARS_PER_TOKEN)] * len(texts)
    # A text shorter than twice the first prefix is tokenized whole at once: a
    # prefix too short for it would be work thrown away.
    todo = [i for i, text in enumerate(texts) if len(text) >= 2 * span[i]]
    whole: list[int] = [i for i, text in enumerate(texts) if len(text) < 2 * span[i]]
    while todo:
        pieces: list[str] = []
        for i in todo:
            text = texts[i]
            if side == "right":
                pieces.append(text[: _cut_right(text, span[i])])
            else:
                pieces.append(text[_cut_left(text, len(text) - span[i]) :])
        encoding = tokenizer(pieces, truncation=False, **plain)
        retry: list[int] = []
        for j, i in enumerate(todo):
            if len(pieces[j]) == len(texts[i]):
                whole.append(i)
                continue
            stable = _stable(encoding, j, need, side)
            if stable is None:
                whole.append(i)
            elif stable:
                results[i] = _as_truncated(encoding, j, encode_kwargs, side)
            else:
                span[i] *= 2
                retry.append(i)
        todo = retry
    if whole:
        ids = tokenizer([texts[i] for i in whole], **encode_kwargs)["input_ids"]
        for i, one in zip(whole, ids, strict=True):
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
