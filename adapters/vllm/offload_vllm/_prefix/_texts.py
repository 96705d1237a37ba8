"""Prefix tokenization of single texts (`encode_truncated`): each text's
pieces tried in turn, in one tokenizer call per round, until one holds one
more stable token than vLLM keeps; else the whole text."""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import Any

from ._cuts import Side, _encodable, _pieces, _reach
from ._plan import plan


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
