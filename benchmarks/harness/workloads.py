"""Request bodies for the end-to-end measurements (deterministic, nothing downloaded).

Each builder gives `count` distinct bodies as JSON bytes, encoded once, so that a
load generator spends no CPU per request encoding a body of up to a megabyte;
`bodies` makes a picklable factory of one, for a process that builds its own
(the mixed suite's flood).
"""

from __future__ import annotations

import base64
import functools
import io
import json
import random
from collections.abc import Callable
from typing import Any

#: Builds a list of request bodies (JSON bytes); module-level functions and
#: `functools.partial`s of them, so that the flood's can be sent to its process.
Bodies = Callable[[], list[bytes]]

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


def _dump(body: dict[str, Any], truncate: int | None = None) -> bytes:
    if truncate is not None:
        body["truncate_prompt_tokens"] = truncate
    return json.dumps(body).encode()


def text_bodies(
    model: str, *, count: int, inputs: int, words: int, truncate: int | None = None, seed: int = 0
) -> list[bytes]:
    """`count` distinct `/v1/embeddings` bodies of `inputs` texts of `words` words each."""
    return [
        _dump({"model": model, "input": long_texts(inputs, words, seed=seed + i)}, truncate) for i in range(count)
    ]


def one_text_bodies(model: str, *, count: int, words: int) -> list[bytes]:
    """`count` distinct `/v1/embeddings` bodies of one text each, as a string (the single-prompt form)."""
    return [_dump({"model": model, "input": text}) for text in long_texts(count, words)]


def multilingual_bodies(
    model: str, *, count: int, inputs: int, words: int, truncate: int | None = None, seed: int = 0
) -> list[bytes]:
    """`text_bodies` with multilingual texts (`models.multilingual_text`: several
    scripts and the characters an `nmt_nfkc` map rewrites)."""
    from benchmarks.harness.models import multilingual_text

    return [
        _dump({"model": model, "input": [multilingual_text(words, seed=100 * (seed + i) + j) for j in range(inputs)]},
              truncate)
        for i in range(count)
    ]


def token_id_bodies(
    model: str, *, count: int, inputs: int, ids: int, truncate: int | None = None, seed: int = 0
) -> list[bytes]:
    """`count` distinct `/v1/embeddings` bodies of `inputs` lists of `ids` token ids each
    (ids of a BERT vocabulary, past its special tokens)."""
    bodies = []
    for i in range(count):
        rng = random.Random(seed + i)
        ids_lists = [[rng.randrange(1000, 30_000) for _ in range(ids)] for _ in range(inputs)]
        bodies.append(_dump({"model": model, "input": ids_lists}, truncate))
    return bodies


def score_bodies(
    model: str, *, count: int, documents: int, words: int, truncate: int | None = None, seed: int = 0
) -> list[bytes]:
    """`count` distinct `/score` bodies: one 8-word query against `documents` documents of `words` words."""
    return [
        _dump({"model": model, "queries": long_texts(1, 8, seed=seed + i)[0],
               "documents": long_texts(documents, words, seed=seed + i + 1)}, truncate)
        for i in range(count)
    ]


def rerank_bodies(model: str, *, count: int, documents: int, words: int, truncate: int | None = None) -> list[bytes]:
    """`count` distinct `/rerank` bodies: one query and `documents` long documents;
    with `truncate`, what a cross-encoder tokenizes of each and throws away is the work."""
    query = "which of these passages says the most about the quick brown fox?"
    return [
        _dump({"model": model, "query": query, "documents": long_texts(documents, words, seed=i)}, truncate)
        for i in range(count)
    ]


def photo_jpeg_base64(size: int, seed: int = 0) -> str:
    """A `size`-pixel square JPEG that compresses like a photo (smooth noise, upscaled):
    decoding costs what a photo of that size costs, without noise's megabytes of body."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    coarse = Image.fromarray(rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8), "RGB")
    buf = io.BytesIO()
    coarse.resize((size, size), Image.Resampling.BILINEAR).save(buf, format="JPEG", quality=90)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def image_bodies(model: str, *, count: int, images: int, size: int, seed: int = 0) -> list[bytes]:
    """`count` distinct `/v1/embeddings` bodies of `images` conversations of one image each
    (CLIP takes one image per prompt): vLLM's chat form for one, its batched chat form for more."""
    rng = random.Random(seed)
    bodies = []
    for _ in range(count):
        conversations = [
            [{"role": "user", "content": [
                {"type": "image_url",
                 "image_url": {"url": f"data:image/jpeg;base64,{photo_jpeg_base64(size, rng.randrange(2**31))}"}},
            ]}]
            for _ in range(images)
        ]
        bodies.append(_dump({"model": model, "messages": conversations[0] if images == 1 else conversations}))
    return bodies


def bodies(build: Callable[..., list[bytes]], model: str, **kwargs: Any) -> Bodies:
    """A picklable `Bodies` for `build(model, **kwargs)`."""
    return functools.partial(build, model, **kwargs)


def jpeg_base64(size: int = 224, seed: int = 0) -> str:
    """A random-noise RGB JPEG, base64-encoded (noise does not compress: a realistic decode cost)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="JPEG", quality=90)
    return base64.b64encode(buf.getvalue()).decode("ascii")
