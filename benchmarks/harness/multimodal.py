"""A tiny randomly initialised CLIP, built locally, to try image embeddings through vLLM.

    python -m benchmarks.harness.multimodal DIR     # builds DIR/tiny-clip
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CLIP_NAME = "tiny-clip"


def build_tiny_clip(dest: Path, seed: int = 0) -> Path:
    """CLIPModel (1 layer per tower, hidden 64, 2 heads: head_dim 32) with MiniLM's WordPiece
    vocabulary instead of CLIP's BPE one (not available offline).

    vLLM's CLIP processor uses token id 0 as its image placeholder and asserts it is
    not a special token; in BERT's vocabulary id 0 is [PAD], so [PAD] and [unused0]
    trade places. Only vocab.txt is written, so the fast tokenizer is built from it.
    """
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    from benchmarks.harness.models import minilm_dir

    if (dest / "model.safetensors").exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    # projection_dim is also set per tower: vLLM sizes its input-embeddings buffer from the text one.
    tower = {"hidden_size": 64, "num_attention_heads": 2, "num_hidden_layers": 1, "intermediate_size": 128,
             "projection_dim": 64}
    config = CLIPConfig(
        text_config={**tower, "vocab_size": 30522, "max_position_embeddings": 77,
                     "bos_token_id": 101, "eos_token_id": 102, "pad_token_id": 1},
        vision_config={**tower, "image_size": 224, "patch_size": 32},
        projection_dim=64,
    )
    CLIPModel(config).save_pretrained(dest, safe_serialization=True)
    CLIPImageProcessor().save_pretrained(dest)
    vocab = (minilm_dir() / "vocab.txt").read_text().splitlines()
    vocab[0], vocab[1] = vocab[1], vocab[0]
    (dest / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": 77,
        "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    }))
    return dest


if __name__ == "__main__":
    print(build_tiny_clip(Path(sys.argv[1] if len(sys.argv) > 1 else "build/models") / CLIP_NAME))
