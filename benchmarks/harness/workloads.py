"""Request bodies for the end-to-end measurements (deterministic, nothing downloaded)."""

from __future__ import annotations

import base64
import functools
import io
import json
import random
from collections.abc import Sequence
from typing import Any, final

Payload = dict[str, Any]


@final
class Rotation:
    """Request bodies sent in turn: request `i` is `payloads[i % len(payloads)]`.

    Calling it gives the payload (a dict); `body(i)` gives the same payload
    as JSON bytes, encoded once for the whole run, so that a load generator
    spends no CPU per request re-encoding a body of up to a megabyte."""

    def __init__(self, payloads: Sequence[Payload]) -> None:
        if not payloads:
            raise ValueError("a rotation needs at least one payload")
        self.payloads = tuple(payloads)

    def __call__(self, i: int) -> Payload:
        return self.payloads[i % len(self.payloads)]

    @functools.cached_property
    def bodies(self) -> tuple[bytes, ...]:
        """Every payload as JSON bytes (what `json.dumps` gives, UTF-8)."""
        return tuple(json.dumps(payload).encode() for payload in self.payloads)

    def body(self, i: int) -> bytes:
        """Request `i`'s payload as JSON bytes."""
        return self.bodies[i % len(self.payloads)]

# Common English words: real wordpieces, so tokenization costs what it costs on prose.
_WORD_TEXT = (
    "the of and to in is was for on that with as by at from his her they this had not are but "
    "which have one were all their there been has when who will more would about into time "
    "only some could new other than then now people may first after these over such where "
    "most through many before must between very under city world water house school market "
    "system program question government number night point family story light river money "
    "morning history country company student result change reason research example evening "
    "mountain language picture village station problem machine garden window kitchen engine"
)
_WORDS = _WORD_TEXT.split()


def long_texts(n: int, words: int = 160, seed: int = 0) -> list[str]:
    """`n` distinct texts of `words` words each (150+ words: tokenization is the work)."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(_WORDS, k=words)) + "." for _ in range(n)]


def embed_payload(model: str, text: str | list[str]) -> Payload:
    return {"model": model, "input": text}


def long_text_factory(model: str, pool: int = 256, words: int = 160) -> Rotation:
    return Rotation([embed_payload(model, text) for text in long_texts(pool, words)])


def many_texts_factory(model: str, per_request: int = 256, words: int = 12) -> Rotation:
    """Many short inputs per request: building the response (one vector per input) dominates."""
    return Rotation([embed_payload(model, long_texts(per_request, words, seed=s)) for s in range(4)])


def truncated_texts_factory(model: str, per_request: int = 16, words: int = 1500, keep: int = 32) -> Rotation:
    """Long inputs kept to a few tokens (`truncate_prompt_tokens`): what vLLM
    tokenizes and then throws away is the work."""
    return Rotation([
        {**embed_payload(model, long_texts(per_request, words, seed=s)), "truncate_prompt_tokens": keep}
        for s in range(4)
    ])


def rerank_factory(model: str, documents: int = 32, words: int = 5000, keep: int = 512) -> Rotation:
    """One query and `documents` long documents per `/rerank` request, each
    pair kept to `keep` tokens (`truncate_prompt_tokens`): what a cross-encoder
    tokenizes of each document and then throws away is the work."""
    query = "which of these passages says the most about the quick brown fox?"
    return Rotation([
        {"model": model, "query": query, "documents": long_texts(documents, words, seed=s), "truncate_prompt_tokens": keep}
        for s in range(4)
    ])


def multilingual_truncated_factory(model: str, per_request: int = 16, words: int = 1500, keep: int = 32) -> Rotation:
    """`truncated_texts_factory` with multilingual texts (`models.multilingual_text`:
    several scripts and the characters an `nmt_nfkc` map rewrites)."""
    from .models import multilingual_text

    return Rotation([
        {
            **embed_payload(model, [multilingual_text(words, seed=100 * s + j) for j in range(per_request)]),
            "truncate_prompt_tokens": keep,
        }
        for s in range(4)
    ])


def jpeg_base64(size: int = 224, seed: int = 0) -> str:
    """A random-noise RGB JPEG, base64-encoded (noise does not compress: a realistic decode cost)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="JPEG", quality=90)
    return base64.b64encode(buf.getvalue()).decode("ascii")
