"""A tiny, randomly initialised multimodal (image + text) model vLLM's CPU build serves.

Idefics3 (a SigLIP-like vision tower, a Llama text model), both one layer of
width 64, with the packaged all-MiniLM-L6-v2 tokenizer and the image tokens
Idefics3's processor inserts: the Hugging Face processor (resizing, splitting
into tiles, normalising) costs what it costs for any image of that size,
while the model's forward costs almost nothing. Built locally from a config
(nothing is downloaded).

    python -m benchmarks.harness.mm_models [DIR]   # DIR/tiny-idefics3 (default build/models)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .models import minilm_dir

TINY_IDEFICS3_NAME = "tiny-idefics3"
#: The tokens Idefics3's processor and chat format need beside the tokenizer's own.
IMAGE_TOKENS = ("<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>")
#: A 56-pixel vision tile of 14-pixel patches (a 4 x 4 grid); scale factor 2
#: folds it to 4 image tokens (`IMAGE_SEQ_LEN`). Head dim 32: vLLM's CPU
#: attention rejects 16.
VISION: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "image_size": 56,
    "patch_size": 14,
}
SCALE_FACTOR = 2
IMAGE_SEQ_LEN = 4
#: Images are resized to at most 112 pixels a side and cut into 56-pixel
#: tiles (at most four, and the whole image once more).
LONGEST_EDGE = 112
TILE_EDGE = 56
#: One line per message; an image part is the `<image>` token the processor expands.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: "
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' or c['type'] == 'image_url' %}<image>{% else %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def build_tiny_multimodal_model(dest: Path, seed: int = 0) -> Path:
    """A one-layer Idefics3 at `dest` (weights from `seed`); an existing build is kept."""
    import torch
    from transformers import (
        AutoTokenizer,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessor,
        Idefics3Processor,
        LlamaConfig,
    )
    from transformers.models.idefics3 import Idefics3VisionConfig

    if (dest / "model.safetensors").exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    tokenizer.add_special_tokens({"additional_special_tokens": list(IMAGE_TOKENS)})
    tokenizer.chat_template = CHAT_TEMPLATE
    image_token_id = tokenizer.convert_tokens_to_ids("<image>")
    assert isinstance(image_token_id, int)
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    config = Idefics3Config(
        text_config=text.to_dict(),
        vision_config=Idefics3VisionConfig(**VISION).to_dict(),
        scale_factor=SCALE_FACTOR,
        image_token_id=image_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    Idefics3ForConditionalGeneration(config).eval().save_pretrained(dest, safe_serialization=True)
    image_processor = Idefics3ImageProcessor(
        size={"longest_edge": LONGEST_EDGE}, max_image_size={"longest_edge": TILE_EDGE}
    )
    processor = Idefics3Processor(
        image_processor=image_processor, tokenizer=tokenizer, image_seq_len=IMAGE_SEQ_LEN, chat_template=CHAT_TEMPLATE
    )
    processor.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", nargs="?", type=Path, default=Path("build/models"))
    args = parser.parse_args(argv)
    print(build_tiny_multimodal_model(args.dir / TINY_IDEFICS3_NAME))
    return 0


if __name__ == "__main__":
    sys.exit(main())
