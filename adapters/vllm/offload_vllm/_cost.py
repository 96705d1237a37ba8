"""What a request's work costs, estimated before it is done, and how a large request is cut into pieces.

**The unit is one character of input** (about a byte of the request body:
text is mostly ASCII, an image arrives as base64 text). Every string in a
request's inputs counts its characters (a multimodal request's base64 images
count theirs), every token id counts one, and every input (a text, a
token-id list, a chat message, an image, a scoring pair) adds `PROMPT_COST`
for the work rendering does per prompt whatever its length. A string in a
field vLLM loads images from (`Images`; which fields, `_seams/requests.py`)
adds `image_cost`: `IMAGE_COST` for the work vLLM does per image whatever
its size, plus `PIXEL_COST` per pixel, read from the image's header bytes
when its bytes are in the request (a data URL: `_image_header`, no
decoding); an image whose size is not read there costs `URL_IMAGE_COST`,
what a 512 x 512 image costs (both parts). Any other string is text,
whatever it begins with. The chat template and the template and processor arguments a
request sends count their characters. A request is charged at least
`body_floor` of its body's bytes. The estimate walks the already-parsed
request once, on the event loop, before anything is rendered, in work
bounded by a small constant per byte (`characters`); the early-refusal
middleware, which has not read the body yet, uses `body_floor` of its
`Content-Length`, which is never more.

The figures below are measured against the unit itself, timed in the same
run: tokenizing prose with all-MiniLM-L6-v2's fast tokenizer, 297 ns a
character on the 2-core test machine (`python -m benchmarks render-cost`,
`benchmarks/results/latest/render-cost/`), where the image prices were
converted at 0.36 µs. That run also times a render call handed to a
worker, against the same call on the event loop, by wall-clock time: a
`thread` hand-off added 0.16 ms to a call of one prompt, a `process`
hand-off 0.48 ms, and 14 µs a prompt more (pickled both ways). It renders
a request of one prompt of prose at 1.38 [1.27, 1.51] of its price: a
character rendered through vLLM costs more than a character tokenized by
the tokenizer alone (docs/decisions/0018-a-prompt-priced-128-and-a-value-2.5.md).
Through a server (`python -m benchmarks image-cost`, tiny CLIP, `inline`),
a one-image request costs the loop ~3.7-3.8 ms more than a short text
request at 32 and 96 pixels: `IMAGE_COST`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from typing import Any, final

from PIL import Image
from pydantic import BaseModel

from . import _image_header, _prefix

#: What rendering one prompt costs beyond its characters. `python -m
#: benchmarks render-cost` (`benchmarks/results/latest/render-cost/`):
#: vLLM's renderer rendered 150 one-word prompts, one call each, and one
#: prompt of the same words; solved for a cost per prompt and per character,
#: a prompt cost 110.6 [107.1, 113.4] units beyond its characters, 0.86 of
#: this price. Why: docs/decisions/0018-a-prompt-priced-128-and-a-value-2.5.md
PROMPT_COST = 128

#: A piece of one request's rendering costs at most this much (one prompt may
#: cost more: a prompt is never split): ~5 ms at the unit `render-cost`
#: measured (297 ns). A `process` hand-off of a piece of 16 prompts adds about
#: 0.7 ms to it (0.48 ms and 14 µs a prompt, `render-cost`), and a small
#: request waits at most about a piece per busy worker behind another
#: request's pieces.
PIECE_COST = 16384

#: Decoding an image costs this much per pixel (decode, then CLIP's resize,
#: crop and normalise): ~37 ns a pixel for a PNG, ~20 ns for a JPEG, at ~0.36
#: µs a character. Measured on the 2-core test machine: base64 PNG and JPEG
#: images of 256² to 2048² pixels, `PIL.Image.open(...).convert("RGB")` then
#: `transformers.CLIPImageProcessorPil()` (the tiny CLIP's preprocessing in
#: the benchmarks), median of 7 runs each; the slope between 512² and 2048²
#: was 36.8 ns/px (PNG) and 19.5 ns/px (JPEG): 0.1 character a pixel is the PNG's.
#: Why: docs/decisions/0004-image-price-0.1-a-pixel.md
PIXEL_COST = 0.1

#: Loading any image costs the event loop this much whatever its size (vLLM's
#: multimodal processing of it; a few pixels or a few bytes change nothing):
#: ~3.79 ms / 0.36 µs a character = 10,528, rounded to 10,500. Measured with
#: `python -m benchmarks image-cost` (one `inline` server, tiny CLIP, the loop
#: thread's CPU; `benchmarks/results/latest/image-cost/`): a one-image
#: request's loop CPU above a short text request's, median of 100, was 3.79
#: ms for a 32-pixel JPEG and 3.72 ms for a 96-pixel one (their pixels are
#: priced 0.04 and 0.33 ms). Without it a request of one 1 x 1 PNG (114
#: characters) was priced 255, under the inline cost, and rendered on the
#: loop, ~3.7 ms if it costs what those did (not measured at 1 pixel): ~33 µs
#: a byte. docs/decisions/0015-a-fixed-price-per-image.md.
IMAGE_COST = 10_500

#: An image whose size cannot be read before vLLM loads it (one given by a
#: URL vLLM fetches, or a data URL of a format whose header is not read
#: here) is priced as a 512 x 512 image: `IMAGE_COST` and its pixels.
URL_IMAGE_COST = IMAGE_COST + PIXEL_COST * 512 * 512

#: How a URL begins that vLLM fetches an image from (lower-cased; `file:`
#: only with `--allowed-local-media-path`).
FETCHED_URL = ("http://", "https://", "file:")

#: Pillow refuses to open an image of more pixels than this, before decoding
#: it (`DecompressionBombError`: twice its `MAX_IMAGE_PIXELS`; vLLM's own
#: `VLLM_MAX_IMAGE_PIXELS` defaults to the same 178,956,970): such an image
#: costs no pixels.
MAX_IMAGE_PIXELS: float = math.inf if Image.MAX_IMAGE_PIXELS is None else 2 * Image.MAX_IMAGE_PIXELS

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
#: embedding, a score). `python -m benchmarks render-cost`
#: (`benchmarks/results/latest/render-cost/`): building vLLM's embeddings
#: answer as floats (Starlette's `JSONResponse`) cost 1.77 [1.71, 1.83] units
#: a value (from 32 x 384 to 32 x 1024 values), 1.18 of the 1.5 it was
#: priced; 2.5 bounds it (0.71), and a one-sentence embedding's answer
#: (40 + 384 x 2.5 = 1,000) stays under `OFFLOAD_VLLM_INLINE_COST`'s 1,024,
#: on the loop. As base64, an answer cost 0.03 of its price.
#: Why: docs/decisions/0018-a-prompt-priced-128-and-a-value-2.5.md
POSTPROCESS_COST_PER_VALUE = 2.5

#: Building the response costs this much per engine output besides its values
#: (an embedding's or a score's own object in the answer: a rerank result with
#: its document, index and score). `python -m benchmarks echo-cost`
#: (`benchmarks/results/latest/echo-cost/`, the rows of empty documents): a
#: rerank answer without text cost 7.5-9 µs a document, about 30 units; 40
#: bounds it. Without it, an answer of many short documents was priced at its
#: scores alone (1.5 each then), a twentieth of its work, and built on the
#: event loop. `render-cost`: an embedding besides its values cost 15.9
#: [14.9, 17.3] units (256 outputs of 8 values), 0.40 of this.
#: Why: docs/decisions/0017-an-echoed-character-priced-0.1.md
POSTPROCESS_COST_PER_OUTPUT = 40.0

#: Building the response costs this much per character of the request it
#: carries back (a rerank answer echoes every document: its text, or a
#: multimodal document's content parts). `python -m benchmarks echo-cost`
#: (`benchmarks/results/latest/echo-cost/`): the costliest answer, control
#: characters and emoji encoded by Starlette's encoder (an answer
#: `_seams/responses.py` leaves to it), cost 0.070 of a character's
#: tokenizing per character, 0.70 of this price; prose encoded by
#: pydantic-core, 0.003. Why: docs/decisions/0017-an-echoed-character-priced-0.1.md
ECHO_COST_PER_CHARACTER = 0.1


class TooDeep(ValueError):
    """A request's inputs nest deeper than `MAX_DEPTH` (answered HTTP 400)."""


class Images(enum.Enum):
    """Which strings of a request field vLLM may load as images (`characters`)."""

    #: None: every string is text (a completion's `input`, a text part, a template's arguments).
    NONE = "none"
    #: Content parts (chat messages, `/v2/embed`'s `inputs`, scoring content):
    #: the string under an `image_url` key, or under its `url`.
    PARTS = "parts"
    #: Every string (`/v2/embed`'s `images`).
    EVERY = "every"


def characters(
    value: Any, cap: int | None = None, images: Images = Images.NONE, priced: PricedTexts | None = None
) -> float:
    """The cost of every string in `value` (lists, tuples, dicts' values and
    pydantic models' fields, all the way down): its characters, plus
    `image_cost` for a string that `images` says vLLM loads as an image;
    plus one per token id (int). Anything else (a float, `None`, a tensor)
    counts 0. `cap`: a string is a text prompt truncated to this many
    tokens (`truncated_cap`), and counts the most characters prefix
    tokenization hands the tokenizer for it (`_prefix.read_bound`): a few
    first guesses of characters per token where it has the words to stop
    there, else its length and the pieces tried (at most twice its length);
    with `priced`, read once per text there (`PricedTexts.read_bound`).

    Walked a level at a time, without recursion and with no per-node
    allocation beyond the next level's list, so its cost per byte of the
    request is a small constant (below vLLM's own parsing of a body of
    texts, token ids or nested lists; ~1.5 µs per string of an image
    field, `_image_header`); deeper than `MAX_DEPTH` raises `TooDeep`."""
    total = 0.0
    every = images is Images.EVERY
    parts = images is Images.PARTS
    level: list[Any] = [value]
    depth = 0
    while level:
        below: list[Any] = []
        for item in level:
            kind = type(item)
            if kind is str:
                # What prefix tokenization may read of it: its pieces, and the
                # whole text where they may not be enough.
                if cap is None:
                    total += len(item)
                else:
                    total += _prefix.read_bound(item, cap) if priced is None else priced.read_bound(item, cap)
                if every:
                    total += image_cost(item)
            elif kind is int:
                total += 1
            elif kind is list or kind is tuple:
                if depth >= MAX_DEPTH:
                    raise TooDeep(f"the request's inputs nest deeper than {MAX_DEPTH} levels")
                # A token-id list (all ints): counted without walking it.
                if item and type(item[0]) is int and set(map(type, item)) == {int}:
                    total += len(item)
                else:
                    below += item
            elif kind is dict or isinstance(item, (dict, BaseModel)):
                if depth >= MAX_DEPTH:
                    raise TooDeep(f"the request's inputs nest deeper than {MAX_DEPTH} levels")
                fields = item if isinstance(item, dict) else vars(item)
                if parts:
                    url = fields.get("image_url")
                    if isinstance(url, dict):
                        url = url.get("url")
                    if isinstance(url, str):
                        total += image_cost(url)
                below += fields.values()
            elif kind is bytes:
                total += len(item)  # never prefix-tokenized
            elif isinstance(item, (list, tuple)):
                if depth >= MAX_DEPTH:
                    raise TooDeep(f"the request's inputs nest deeper than {MAX_DEPTH} levels")
                below += item
            elif isinstance(item, str):
                total += len(item)
        level = below
        depth += 1
    return total


def image_cost(url: str) -> float:
    """What loading the image at `url` costs beyond its characters, for a
    string vLLM loads as an image (`MediaConnector.load_from_url`). Every
    image vLLM loads costs `IMAGE_COST` plus its pixels:

    - a data URL: `IMAGE_COST` plus `PIXEL_COST` per pixel, the size read
      from the image's header (`_image_header.read_size`: PNG, JPEG, GIF,
      WebP; no decoding); `URL_IMAGE_COST` (a 512 x 512 image) when its
      base64 decodes but its size does not show there (another format
      Pillow may open); 0 when vLLM refuses it before decoding any pixels
      (not base64, bad base64, a truncated header, more pixels than
      `MAX_IMAGE_PIXELS`);
    - a URL vLLM fetches (http, https, file): `URL_IMAGE_COST`;
    - anything else: 0 (vLLM refuses it)."""
    scheme = url[:8].lower()
    if scheme.startswith("data:"):
        size = _image_header.read_size(url)
        if size is None:
            return 0.0
        if size is _image_header.UNSIZED:
            return URL_IMAGE_COST
        pixels = size[0] * size[1]
        return 0.0 if pixels > MAX_IMAGE_PIXELS else IMAGE_COST + PIXEL_COST * pixels
    if scheme.startswith(FETCHED_URL):
        return URL_IMAGE_COST
    return 0.0


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


def inputs_cost(
    value: Any, cap: int | None = None, images: Images = Images.NONE, priced: PricedTexts | None = None
) -> float:
    """The cost of rendering `value`, one request field of inputs (texts,
    token ids, messages, images); `cap`, `images` and `priced` as `characters` takes them."""
    return float(characters(value, cap, images, priced) + PROMPT_COST * prompts(value))


def pairs_cost(
    queries: Any,
    documents: Any,
    images: Images = Images.NONE,
    cap: int | None = None,
    *,
    whole_pairs: bool = False,
    priced: PricedTexts | None = None,
) -> float:
    """The cost of scoring `queries` against `documents` (vLLM pairs one query
    with every document, or the i-th query with the i-th document): every
    pair renders its query and its document; `images` as `characters` takes it.
    `cap`: the pairs are truncated to this many tokens (`truncated_cap`), and
    a text pair counts the most characters prefix tokenization hands the
    tokenizer for it, as a cross-encoder's pair (`_prefix.pair_read_bound`)
    or as two prompts of a bi-encoder's (`_prefix.read_bound`), whichever is
    more; `whole_pairs`: a cross-encoder tokenizes pairs whole (`_prefix.pair_plan`);
    `priced`: each text pair's cost is kept there (or read from it, where it
    was kept already) for pricing the pair again (`PricedTexts`)."""
    query_list = _as_list(queries)
    document_list = _as_list(documents)
    pairs = len(document_list)
    if cap is not None and len(query_list) in (1, pairs):
        together = query_list * pairs if len(query_list) == 1 else query_list
        price = pair_cost if priced is None else priced.cost
        return float(sum(price(q, d, images, cap, whole_pairs) for q, d in zip(together, document_list, strict=True)) + PROMPT_COST * pairs)
    query_characters = sum(characters(q, images=images) for q in query_list)
    if len(query_list) == 1:
        query_characters *= pairs
    return float(query_characters + sum(characters(d, images=images) for d in document_list) + PROMPT_COST * pairs)


def pair_cost(query: Any, document: Any, images: Images, cap: int, whole_pairs: bool = False) -> float:
    """The characters one scoring pair truncated to `cap` tokens costs (`pairs_cost`)."""
    if type(query) is str and type(document) is str:
        if whole_pairs:
            pair, alone = len(query) + len(document), _prefix.read_bound(document, cap)
        else:
            pair, alone = _prefix.pair_read_bounds(query, document, cap)
        return float(max(pair, _prefix.read_bound(query, cap) + alone))
    return characters(query, images=images) + characters(document, images=images)


@final
class PricedTexts:
    """The costs of one request's truncated texts (`_prefix.read_bound`) and
    text pairs (`pair_cost`), kept as they are first read (at admission) for
    when its rendering is priced again to be cut into pieces: each text and
    each pair is scanned once on the event loop. A text is known by the
    identity of its string, a pair by its two (the render parameters vLLM
    builds hold the request's own), with the arguments that price it. Holds
    one request's strings for as long as it is kept: one request's lifetime."""

    __slots__ = ("_bounds", "_costs")

    def __init__(self) -> None:
        # Each value holds its strings, so no key's ids are reused while it is here.
        self._costs: dict[tuple[int, int, int, bool], tuple[str, str, float]] = {}
        self._bounds: dict[tuple[int, int], tuple[str, int]] = {}

    def read_bound(self, text: str, cap: int) -> int:
        """`_prefix.read_bound(text, cap)`, read once per text."""
        key = (id(text), cap)
        known = self._bounds.get(key)
        if known is None:
            known = self._bounds[key] = (text, _prefix.read_bound(text, cap))
        return known[1]

    def cost(self, query: Any, document: Any, images: Images, cap: int, whole_pairs: bool = False) -> float:
        """`pair_cost(query, document, images, cap, whole_pairs)`, read once per text pair."""
        if type(query) is not str or type(document) is not str:
            return pair_cost(query, document, images, cap, whole_pairs)
        key = (id(query), id(document), cap, whole_pairs)
        known = self._costs.get(key)
        if known is None:
            known = self._costs[key] = (query, document, pair_cost(query, document, images, cap, whole_pairs))
        return known[2]


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
