"""What prefix tokenization reads, at most: the characters it may hand the
tokenizer for a text (`read_bound`) or a pair (`pair_read_bound`), which a
truncated request is priced by (`_cost.py`). Runs on the event loop."""

from __future__ import annotations

from ._cuts import Side, _encodable, _pieces, _reach


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
