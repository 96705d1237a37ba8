"""What a request's work costs, estimated before it is done, and how a large request is cut into pieces.

**The unit is one character of input** (about a byte of the request body:
text is mostly ASCII, an image arrives as base64 text). Every string in a
request's inputs counts its characters (a multimodal request's base64 images
count theirs), every token id counts one, and every input (a text, a
token-id list, a chat message, an image, a scoring pair) adds `PROMPT_COST`
for the work rendering does per prompt whatever its length. The estimate
walks the already-parsed request once, before anything is rendered; the
early-refusal middleware, which has not read the body yet, uses its
`Content-Length` in the same unit.

Figures measured on the 2-core test machine with all-MiniLM-L6-v2's fast
tokenizer through vLLM's renderer (`PoolingIOProcessor.render`): ~0.36 µs per
character, plus ~50 µs per prompt; building an embeddings response, ~0.55
µs per output value (float); a `process` hand-off, ~0.3 ms plus ~25 µs per
prompt pickled both ways; a `thread` hand-off, ~0.02 ms.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from . import _prefix

#: What rendering one prompt costs beyond its characters: ~50 µs at ~0.36 µs a character.
PROMPT_COST = 128

#: A piece of one request's rendering costs at most this much (one prompt may
#: cost more: a prompt is never split). ~6 ms of rendering: a `process` hand-off
#: is ~5% of it, and a small request waits at most that long per busy worker
#: behind another request's pieces.
PIECE_COST = 16384

#: Building the response costs this much per output value (a float of an
#: embedding, a score): ~0.55 µs a value against ~0.36 µs a character.
POSTPROCESS_COST_PER_VALUE = 1.5


def characters(value: Any, cap: int | None = None) -> int:
    """The characters of every string in `value` (lists, tuples, dicts' values
    and pydantic models' fields, all the way down), plus one per token id.
    Anything else (a number that is not a token id, a tensor) counts 0.
    `cap`: a string counts at most this many (a truncated text prompt, which
    prefix tokenization reads only the start of: `truncated_cap`)."""
    if isinstance(value, (str, bytes)):
        return len(value) if cap is None else min(len(value), cap)
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return 1
    if isinstance(value, (list, tuple)):
        # A token-id list is all ints (vLLM validated it): count it without a loop.
        if value and type(value[0]) is int:
            return len(value)
        return sum(characters(item, cap) for item in value)
    if isinstance(value, dict):
        return sum(characters(item, cap) for item in value.values())
    if isinstance(value, BaseModel):
        return sum(characters(item, cap) for item in vars(value).values())
    return 0


def truncated_cap(keep: Any) -> int | None:
    """What a text prompt truncated to `keep` tokens costs at most, in characters,
    when prefix tokenization is on: twice its first prefix (`_prefix.py`), which
    covers one regrowth; `None` (its whole length) for any `keep` that is not a
    positive count (no truncation, or the model's length: -1)."""
    if type(keep) is not int or keep <= 0:
        return None
    return 2 * max(_prefix._MIN_CHARS, (keep + 1) * _prefix._CHARS_PER_TOKEN)


def prompts(value: Any) -> int:
    """How many inputs `value` holds: a string, a token-id list or a single
    object is one; a list of anything else is one per item; `None` is none."""
    if value is None:
        return 0
    if isinstance(value, (list, tuple)):
        if value and type(value[0]) is int:
            return 1
        return len(value)
    return 1


def inputs_cost(value: Any, cap: int | None = None) -> float:
    """The cost of rendering `value`, one request field of inputs (texts,
    token ids, messages, images); `cap` as `characters` takes it."""
    return float(characters(value, cap) + PROMPT_COST * prompts(value))


def pairs_cost(queries: Any, documents: Any) -> float:
    """The cost of scoring `queries` against `documents` (vLLM pairs one query
    with every document, or the i-th query with the i-th document): every
    pair renders its query and its document."""
    query_list = _as_list(queries)
    document_list = _as_list(documents)
    pairs = len(document_list)
    query_characters = sum(characters(q) for q in query_list)
    if len(query_list) == 1:
        query_characters *= pairs
    return float(query_characters + sum(characters(d) for d in document_list) + PROMPT_COST * pairs)


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def split_by_cost(costs: Sequence[float], bound: float = PIECE_COST) -> list[range]:
    """Cut items of `costs` into contiguous pieces, in order, each costing at
    most `bound` (an item costlier than `bound` is a piece of its own), as few
    as that allows: the indices of each piece."""
    pieces: list[range] = []
    start, total = 0, 0.0
    for index, cost in enumerate(costs):
        if index > start and total + cost > bound:
            pieces.append(range(start, index))
            start, total = index, 0.0
        total += cost
    if start < len(costs):
        pieces.append(range(start, len(costs)))
    return pieces
