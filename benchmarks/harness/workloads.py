"""Request bodies for the end-to-end measurements (deterministic, nothing downloaded)."""

from __future__ import annotations

import base64
import io
import random
from collections.abc import Callable
from typing import Any

Payload = dict[str, Any]

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

SHORT_TEXT = "A short sentence for measuring the per-request overhead."


def long_texts(n: int, words: int = 160, seed: int = 0) -> list[str]:
    """`n` distinct texts of `words` words each (150+ words: tokenization is the work)."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(_WORDS, k=words)) + "." for _ in range(n)]


def embed_payload(model: str, text: str | list[str]) -> Payload:
    return {"model": model, "input": text}


def long_text_factory(model: str, pool: int = 256, words: int = 160) -> Callable[[int], Payload]:
    texts = long_texts(pool, words)
    return lambda i: embed_payload(model, texts[i % pool])


def many_texts_factory(model: str, per_request: int = 256, words: int = 12) -> Callable[[int], Payload]:
    """Many short inputs per request: building the response (one vector per input) dominates."""
    batches = [long_texts(per_request, words, seed=s) for s in range(4)]
    return lambda i: embed_payload(model, batches[i % len(batches)])


def truncated_texts_factory(
    model: str, per_request: int = 16, words: int = 1500, keep: int = 32
) -> Callable[[int], Payload]:
    """Long inputs kept to a few tokens (`truncate_prompt_tokens`): what vLLM
    tokenizes and then throws away is the work."""
    batches = [long_texts(per_request, words, seed=s) for s in range(4)]
    return lambda i: {**embed_payload(model, batches[i % len(batches)]), "truncate_prompt_tokens": keep}


def rerank_factory(model: str, documents: int = 32, words: int = 5000, keep: int = 512) -> Callable[[int], Payload]:
    """One query and `documents` long documents per `/rerank` request, each
    pair kept to `keep` tokens (`truncate_prompt_tokens`): what a cross-encoder
    tokenizes of each document and then throws away is the work."""
    batches = [long_texts(documents, words, seed=s) for s in range(4)]
    query = "which of these passages says the most about the quick brown fox?"
    return lambda i: {
        "model": model, "query": query, "documents": batches[i % len(batches)], "truncate_prompt_tokens": keep,
    }


def multilingual_truncated_factory(
    model: str, per_request: int = 16, words: int = 1500, keep: int = 32
) -> Callable[[int], Payload]:
    """`truncated_texts_factory` with multilingual texts (`models.multilingual_text`:
    several scripts and the characters an `nmt_nfkc` map rewrites)."""
    from .models import multilingual_text

    batches = [[multilingual_text(words, seed=100 * s + j) for j in range(per_request)] for s in range(4)]
    return lambda i: {**embed_payload(model, batches[i % len(batches)]), "truncate_prompt_tokens": keep}


def jpeg_base64(size: int = 224, seed: int = 0) -> str:
    """A random-noise RGB JPEG, base64-encoded (noise does not compress: a realistic decode cost)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="JPEG", quality=90)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def image_payload(model: str, b64: str) -> Payload:
    """An embeddings request with one image, in vLLM's chat-style `messages` form."""
    return {
        "model": model,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{b64}"}}],
            }
        ],
    }


def image_factory(model: str, images: int = 8, size: int = 224) -> Callable[[int], Payload]:
    encoded = [jpeg_base64(size, seed) for seed in range(images)]
    return lambda i: image_payload(model, encoded[i % images])
