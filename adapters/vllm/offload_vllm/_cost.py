"""What a request's work costs, estimated before it is done, and how a large request is cut into pieces.

**The unit is one character of input** (about a byte of the request body:
text is mostly ASCII, an image arrives as base64 text). Every string in a
request's inputs counts its characters (a multimodal request's base64 images
count theirs), every token id counts one, and every input (a text, a
token-id list, a chat message, an image, a scoring pair) adds `PROMPT_COST`
for the work rendering does per prompt whatever its length. An image adds
`PIXEL_COST` per pixel, read from its header when its bytes are in the
request (a data URL), else (an http(s) URL) `URL_IMAGE_COST`; the chat
template and the template and processor arguments a request sends count
their characters. A request is charged at least `body_floor` of its body's
bytes. The estimate walks the already-parsed request once, before anything
is rendered; the early-refusal middleware, which has not read the body
yet, uses `body_floor` of its `Content-Length`, which is never more.

Figures measured on the 2-core test machine with all-MiniLM-L6-v2's fast
tokenizer through vLLM's renderer (`PoolingIOProcessor.render`): ~0.36 µs per
character, plus ~50 µs per prompt; building an embeddings response, ~0.55
µs per output value (float); a `process` hand-off, ~0.3 ms plus ~25 µs per
prompt pickled both ways; a `thread` hand-off, ~0.02 ms.
"""

from __future__ import annotations

import base64
import io
import warnings
from collections.abc import Sequence
from typing import Any

from PIL import Image
from pydantic import BaseModel

from . import _prefix

#: What rendering one prompt costs beyond its characters: ~50 µs at ~0.36 µs a character.
PROMPT_COST = 128

#: A piece of one request's rendering costs at most this much (one prompt may
#: cost more: a prompt is never split). ~6 ms of rendering: a `process` hand-off
#: is ~5% of it, and a small request waits at most that long per busy worker
#: behind another request's pieces.
PIECE_COST = 16384

#: Decoding an image costs this much per pixel (decode, then CLIP's resize,
#: crop and normalise): ~37 ns a pixel for a PNG, ~20 ns for a JPEG, at ~0.36
#: µs a character. Measured on the 2-core test machine: base64 PNG and JPEG
#: images of 256² to 2048² pixels, `PIL.Image.open(...).convert("RGB")` then
#: `transformers.CLIPImageProcessorPil()` (the tiny CLIP's preprocessing in
#: the benchmarks), median of 7 runs each; the slope between 512² and 2048²
#: was 36.8 ns/px (PNG) and 19.5 ns/px (JPEG): 0.1 character a pixel is the PNG's.
PIXEL_COST = 0.1

#: An image given by an http(s) URL cannot be measured before vLLM fetches
#: it: it is priced as a 512 x 512 image.
URL_IMAGE_COST = PIXEL_COST * 512 * 512

#: How an image URL that vLLM fetches begins.
HTTP_URL = ("http://", "https://")

#: The data-URL prefix of an image priced by its pixels.
DATA_URL = "data:image/"

#: How much of a data URL is decoded to read its image's size: PNG, GIF and
#: WebP give it in their first bytes, JPEG after its metadata segments
#: (EXIF, ICC profile) of up to 64 KiB.
IMAGE_HEADER_CHARACTERS = 96 * 1024

#: The deepest nesting of a request's inputs that is walked for its cost.
#: vLLM's JSON parser refuses deeper bodies first (about 1,000 levels: HTTP
#: 400 "There was an error parsing the body"); the bound keeps the walk
#: finite for anything else handed to it (a structure that holds itself).
MAX_DEPTH = 10_000

#: The most bytes of a JSON body one unit of cost takes without padding: an
#: astral character (an emoji) escaped as `\ud83d\ude00` is 12 bytes and 1
#: character; an escaped CJK character is 6, a token id with its comma about 7.
#: A request is charged at least its body's bytes over this (`body_floor`),
#: so that the early refusal, which knows only the bytes, never asks more.
BYTES_PER_UNIT = 12


def body_floor(content_length: int) -> float:
    """The least a request whose body is `content_length` bytes is charged:
    its bytes over `BYTES_PER_UNIT` (whitespace and fields that cost nothing
    cost that much; any body of ordinary JSON already costs more)."""
    return max(0, content_length) / BYTES_PER_UNIT


#: Building the response costs this much per output value (a float of an
#: embedding, a score): ~0.55 µs a value against ~0.36 µs a character.
POSTPROCESS_COST_PER_VALUE = 1.5


class TooDeep(ValueError):
    """A request's inputs nest deeper than `MAX_DEPTH` (answered HTTP 400)."""


def characters(value: Any, cap: int | None = None) -> float:
    """The cost of every string in `value` (lists, tuples, dicts' values and
    pydantic models' fields, all the way down): its characters, plus the
    pixels of an image it holds as a data URL (`image_cost`); plus one per
    token id, plus `URL_IMAGE_COST` per image given by an http(s) URL (under
    an `image_url` key). Anything else (a number that is not a token id, a
    tensor) counts 0. `cap`: a string is a text prompt truncated to this many
    tokens (`truncated_cap`), and counts the most characters prefix
    tokenization hands the tokenizer for it (`_prefix.read_bound`): a few
    first guesses of characters per token where it has the words to stop
    there, else its length and the pieces tried (at most twice its length);
    an image's pixels are counted whatever the cap.

    Walked with a stack, not recursion: any depth a parser gives is walked;
    deeper than `MAX_DEPTH` raises `TooDeep`."""
    total = 0.0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            # What prefix tokenization may read of it: its pieces, and the whole
            # text where they may not be enough.
            total += len(item) if cap is None else _prefix.read_bound(item, cap)
            if item.startswith(DATA_URL):
                total += image_cost(item)
            continue
        if isinstance(item, bytes):
            total += len(item)  # never prefix-tokenized
            continue
        if isinstance(item, bool):
            continue
        if isinstance(item, int):
            total += 1
            continue
        if depth >= MAX_DEPTH:
            raise TooDeep(f"the request's inputs nest deeper than {MAX_DEPTH} levels")
        if isinstance(item, (list, tuple)):
            # A token-id list is all ints (vLLM validated it): count it without a loop.
            if item and type(item[0]) is int:
                total += len(item)
            else:
                stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, (dict, BaseModel)):
            fields = item if isinstance(item, dict) else vars(item)
            # A chat content part, or `/v2/embed`'s: `image_url` is a URL or `{"url": URL}`.
            url = fields.get("image_url")
            if isinstance(url, dict):
                url = url.get("url")
            if isinstance(url, str) and url.startswith(HTTP_URL):
                total += URL_IMAGE_COST
            stack.extend((child, depth + 1) for child in fields.values())
    return total


def image_cost(data_url: str) -> float:
    """What decoding the image of `data_url` (`data:image/...;base64,...`)
    costs beyond its characters: `PIXEL_COST` per pixel, the size read from
    the image's header (PIL's `Image.open` reads no more; at most
    `IMAGE_HEADER_CHARACTERS` of the data are decoded for it). 0 when the
    data is no image whose size shows there (it is then priced by its
    characters alone)."""
    head, sep, data = data_url[:IMAGE_HEADER_CHARACTERS].partition(",")
    if not sep or not head.startswith("data:image/") or not head.endswith(";base64"):
        return 0.0
    try:
        raw = base64.b64decode(data[: len(data) // 4 * 4])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(raw)) as image:
                width, height = image.size
    except Image.DecompressionBombError:
        # Past PIL's own bound: vLLM refuses to decode it, cheaply.
        return 0.0
    except Exception:  # any undecodable header: priced by its characters
        return 0.0
    return PIXEL_COST * width * height


def truncated_cap(keep: Any) -> int | None:
    """The token count a text prompt truncated to `keep` tokens is priced by
    when prefix tokenization is on (`characters`' `cap`): `keep`; `None` (its
    whole length) for any `keep` that is not a positive count (no
    truncation, or the model's length: -1)."""
    if type(keep) is not int or keep <= 0:
        return None
    return keep


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
