"""Prefix tokenization of text pairs (a cross-encoder's query and document,
`encode_pair_truncated`): the document is cut by the argument for single texts.

vLLM tokenizes a scoring pair with one call, `tokenizer(text=query,
text_pair=document, **encode_kwargs)` (`CrossEncoderIOProcessor.get_score_prompt`),
then cuts the output as it cuts a single text's (`_truncation_slice`). Where
the call truncates (`truncation=True, max_length=M`), the tokenizers library
cuts the pair *longest first* before adding special tokens: how many tokens
each side keeps depends on the document's length only up to a threshold
(`_pair_kept`), so a prefix of the document with that many stable tokens
gives the same ids. Where it does not (an explicit `truncation_side`, or `M`
below the special tokens), vLLM keeps `keep` tokens of the whole output from
a side: the query and a prefix of the document with enough stable tokens to
fill them give the same."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._cuts import Side, _encodable, _pieces, _reach
from ._plan import pair_plan


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
