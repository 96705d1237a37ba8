"""Prefix tokenization of text pairs (`_prefix.encode_pair_truncated`,
`_seams/scoring.py`): a cross-encoder's (query, document) pair gives exactly
the ids and token type ids vLLM's whole-pair tokenization gives once cut.

The reference is vLLM's own path for a pair (`CrossEncoderIOProcessor.render`):
`tokenizer(text=query, text_pair=document, **TokenizeParams.get_encode_kwargs())`
(which truncates a pair longest first), then `TokenizeParams.apply_post_tokenization`
on the ids and vLLM's `_apply_post_tokenization_to_token_type_ids` on the
type ids; the pair path's output goes through the same two. Every tokenizer
family of `test_prefix_tokenize.py`, texts from its strategies.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from offload_vllm import _prefix
from offload_vllm._prefix import _pairs
from offload_vllm._seams import scoring

from .test_prefix_tokenize import (
    FAMILIES,
    GUESSES,
    PROPERTY,
    SEPARATORS,
    family,
    first_guess,
    hostile_texts,
    piece,
    text_strategy,
)

#: Queries: short or long, ASCII or not (a query may take more than the room).
queries = st.sampled_from(["what is it", "q", "Ångström straße 東京?", " ", "the quick brown fox " * 30]) | text_strategy
#: Documents: `text_strategy`'s texts, most of them long enough to hold more than the limits below.
documents = text_strategy | st.lists(st.tuples(piece, st.sampled_from(SEPARATORS)), min_size=60, max_size=500).map(
    lambda parts: "".join(word + sep for word, sep in parts)
)
#: Limits from 1 to past most documents, most of them below a long document's tokens.
limits = st.integers(1, 48) | st.integers(1, 400)


def vllm_pair(tokenizer: Any, params: Any, ids: list[int], type_ids: list[int] | None) -> object:
    """What vLLM keeps of a pair's tokenizer output (its ids and type ids),
    or the message it refuses it with."""
    from vllm.entrypoints.pooling.scoring.io_processor import (
        _apply_post_tokenization_to_token_type_ids,
    )
    from vllm.exceptions import VLLMValidationError

    try:
        out = params.apply_post_tokenization(tokenizer, {"prompt_token_ids": list(ids)})
    except VLLMValidationError as exc:
        return str(exc)
    types = None if type_ids is None else _apply_post_tokenization_to_token_type_ids(tokenizer, params, list(type_ids))
    return list(out["prompt_token_ids"]), types


def whole_pair(tokenizer: Any, params: Any, query: str, document: str) -> object:
    encoded = tokenizer(text=query, text_pair=document, **params.get_encode_kwargs())
    types = encoded.get("token_type_ids")
    return vllm_pair(tokenizer, params, encoded["input_ids"], None if types is None else list(types))


def prefix_pair(tokenizer: Any, params: Any, query: str, document: str) -> object | None:
    keep, side, priced = scoring.pair_truncation(params, tokenizer)
    got = _prefix.encode_pair_truncated(tokenizer, query, document, params.get_encode_kwargs(), keep, side, priced)
    if got is None:
        return None
    return vllm_pair(tokenizer, params, got["input_ids"], got.get("token_type_ids"))


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_is_one_the_pair_path_is_sound_for(name: str) -> None:
    # Otherwise the properties below would compare whole-pair tokenization with itself.
    assert _prefix.pair_plan(family(name)).reason is None


@pytest.mark.parametrize("name", FAMILIES)
@PROPERTY
@given(
    query=queries,
    document=documents,
    limit=limits,
    side=st.sampled_from([None, "left", "right"]),
    tokenizer_side=st.sampled_from(["right", "left"]),
    add_special_tokens=st.booleans(),
    model_length=st.sampled_from([None, 512]),
    guess=GUESSES,
)
def test_a_pair_tokenized_by_prefix_is_the_whole_pair_cut(
    name: str, query: str, document: str, limit: int, side: str | None, tokenizer_side: str,
    add_special_tokens: bool, model_length: int | None, guess: tuple[int, int],
) -> None:
    """`truncate_prompt_tokens` from 1 to past the pair, vLLM's tokenizer-side
    truncation (longest first) and an explicit `truncation_side` (a cut of the
    whole pair's output), with and without special tokens."""
    from vllm.renderers.params import TokenizeParams

    tokenizer = family(name)
    tokenizer.truncation_side = tokenizer_side
    params = TokenizeParams(
        max_total_tokens=model_length, max_output_tokens=0, truncate_prompt_tokens=limit, truncation_side=side,
        add_special_tokens=add_special_tokens,
    )
    with first_guess(*guess):
        got = prefix_pair(tokenizer, params, query, document)
    if got is not None:
        assert got == whole_pair(tokenizer, params, query, document)


@pytest.mark.parametrize("name", FAMILIES)
@PROPERTY
@given(
    query=queries, document=documents, limit=st.sampled_from([-1, None]),
    tokenizer_side=st.sampled_from(["right", "left"]), guess=GUESSES,
)
def test_a_pair_cut_to_the_model_length(
    name: str, query: str, document: str, limit: int | None, tokenizer_side: str, guess: tuple[int, int]
) -> None:
    """`truncate_prompt_tokens=-1` (the model's length) and none at all, where
    vLLM's tokenizer stops at one past the model's length (and vLLM refuses it)."""
    from vllm.renderers.params import TokenizeParams

    tokenizer = family(name)
    tokenizer.truncation_side = tokenizer_side
    params = TokenizeParams(max_total_tokens=24, max_output_tokens=0, truncate_prompt_tokens=limit)
    with first_guess(*guess):
        got = prefix_pair(tokenizer, params, query, document)
    if got is not None:
        assert got == whole_pair(tokenizer, params, query, document)


def test_long_documents_are_settled_by_a_prefix() -> None:
    """The properties above hold where the pair path answers at all: on long
    documents it does, for every family, both sides and truncation kinds."""
    from vllm.renderers.params import TokenizeParams

    document = " ".join(f"word{i % 97} naïve 東京 text" for i in range(3000))
    for name in FAMILIES:
        tokenizer = family(name)
        for tokenizer_side in ("right", "left"):
            tokenizer.truncation_side = tokenizer_side
            for side in (None, "left", "right"):
                params = TokenizeParams(max_total_tokens=512, max_output_tokens=0, truncate_prompt_tokens=64, truncation_side=side)
                got = prefix_pair(tokenizer, params, "what is it", document)
                assert got is not None, (name, tokenizer_side, side)
                assert got == whole_pair(tokenizer, params, "what is it", document)


def test_longest_first_is_the_tokenizers_librarys() -> None:
    """`_pair_kept` against the tokenizers library itself, on every length of
    each side and room up to 12, and `_pair_threshold`'s claim: from it on,
    the document's length changes nothing."""
    tokenizer = family("wordpiece")
    for query in range(1, 13):
        for document in range(1, 13):
            for max_length in range(3, 16):
                encoded = tokenizer(" ".join(["a"] * query), " ".join(["b"] * document), truncation=True, max_length=max_length)
                kept = encoded.sequence_ids().count(0), encoded.sequence_ids().count(1)
                assert kept == _pairs._pair_kept(query, document, max_length - 3)
    for query in range(40):
        for room in range(40):
            threshold = _pairs._pair_threshold(query, room)
            assert len({_pairs._pair_kept(query, d, room) for d in range(threshold, threshold + 60)}) == 1


class CountedPairs:
    """`tokenizer`, counting the characters it is handed (both texts of a pair)."""

    def __init__(self, tokenizer: Any) -> None:
        self.characters = 0
        original = type(tokenizer).__call__
        counted = self

        class Counting(type(tokenizer)):  # type: ignore[misc]
            def __call__(self, text: Any = None, text_pair: Any = None, *args: Any, **kwargs: Any) -> Any:
                for part in (text, text_pair):
                    counted.characters += len(part) if isinstance(part, str) else sum(map(len, part or ()))
                return original(self, text, text_pair, *args, **kwargs)

        self.tokenizer = Counting.__new__(Counting)
        self.tokenizer.__dict__.update(tokenizer.__dict__)


@pytest.mark.parametrize("name", FAMILIES)
@PROPERTY
@given(
    query=queries | hostile_texts,
    document=hostile_texts | documents,
    limit=limits,
    side=st.sampled_from([None, "left", "right"]),
    tokenizer_side=st.sampled_from(["right", "left"]),
    guess=GUESSES,
)
def test_work_is_at_most_twice_the_whole_pairs_and_never_past_its_price(
    name: str, query: str, document: str, limit: int, side: str | None, tokenizer_side: str, guess: tuple[int, int]
) -> None:
    """Characters handed to the tokenizer for one truncated pair, the whole
    pair included where the pair path gives up (vLLM's own call, as the
    scoring seam makes it): at most twice the pair's, and at most what pricing
    charged for it (`_cost.pairs_cost` with `truncated_cap`); the ids are vLLM's."""
    from offload_vllm._cost import PROMPT_COST, pairs_cost, truncated_cap
    from vllm.renderers.params import TokenizeParams

    tokenizer = family(name)
    tokenizer.truncation_side = tokenizer_side
    params = TokenizeParams(max_total_tokens=None, max_output_tokens=0, truncate_prompt_tokens=limit, truncation_side=side)
    counted = CountedPairs(tokenizer)
    with first_guess(*guess):
        price = pairs_cost(query, [document], cap=truncated_cap(limit)) - PROMPT_COST
        got = prefix_pair(counted.tokenizer, params, query, document)
    if got is None:
        counted.characters += len(query) + len(document)
    else:
        assert got == whole_pair(tokenizer, params, query, document)
    assert counted.characters <= 2 * (len(query) + len(document))
    assert counted.characters <= price, (counted.characters, price)


def test_vllms_render_drops_the_score_prompts_text() -> None:
    """The scoring seam's `get_score_prompt` returns no text for a pair it
    tokenizes by prefix (decoding the ids costs ~40% of tokenizing them):
    sound only while vLLM's `CrossEncoderIOProcessor.render`, the one caller
    that hands it the `TokenizeParams`, throws the text away."""
    import ast
    import inspect

    from vllm.entrypoints.pooling.scoring import io_processor

    # vLLM's source, not the class, which the seam may have patched in this process.
    module = ast.parse(inspect.getsource(io_processor))
    processor = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "CrossEncoderIOProcessor")
    render = next(n for n in processor.body if isinstance(n, ast.FunctionDef) and n.name == "render")
    calls = [
        node for node in ast.walk(render)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
        and getattr(node.value.func, "attr", None) == "get_score_prompt"
    ]
    assert len(calls) == 1
    target = calls[0].targets[0]
    assert isinstance(target, ast.Tuple)
    assert isinstance(target.elts[0], ast.Name)
    assert target.elts[0].id == "_"


def test_the_scoring_seam_gives_vllms_own_score_prompt() -> None:
    """`CrossEncoderIOProcessor.get_score_prompt` as the scoring seam replaces
    it, against vLLM's own on the same processor state (MiniLM's tokenizer,
    long documents, both sides): the same prompt ids and token type ids.
    The class is restored after, for the other tests in this process."""
    import types

    from vllm.entrypoints.pooling.scoring.io_processor import CrossEncoderIOProcessor
    from vllm.renderers.params import TokenizeParams

    saved = {name: CrossEncoderIOProcessor.__dict__[name] for name in ("render", "get_score_prompt")}
    scoring.install_pair_prefix_tokenization()
    try:
        whole = getattr(CrossEncoderIOProcessor, scoring._WHOLE_PAIR)
        tokenizer = family("minilm-wordpiece")
        config = types.SimpleNamespace(enable_prompt_embeds=False, is_multimodal_model=False, multimodal_config=None)
        processor = types.SimpleNamespace(
            supports_score_template=False, use_sep_token=True, tokenizer=tokenizer, model=None, model_config=config
        )
        document = " ".join(f"word{i % 13} naïve text" for i in range(3000))
        for side in (None, "left", "right"):
            for tokenizer_side in ("right", "left"):
                tokenizer.truncation_side = tokenizer_side
                params = TokenizeParams(
                    max_total_tokens=512, max_output_tokens=0, truncate_prompt_tokens=64, truncation_side=side
                )
                token = scoring._tok_params.set(params)
                try:
                    ours = CrossEncoderIOProcessor.get_score_prompt(processor, "what is it", document, params.get_encode_kwargs())
                finally:
                    scoring._tok_params.reset(token)
                theirs = whole(processor, "what is it", document, params.get_encode_kwargs())
                cut = [params.apply_post_tokenization(tokenizer, dict(p))["prompt_token_ids"] for p in (ours[1], theirs[1])]
                assert cut[0] == cut[1], (side, tokenizer_side)
                if side is None:  # vLLM does not cut the tokenizer's output further: all of it is the same
                    assert ours[1] == theirs[1]
    finally:
        for name, value in saved.items():
            setattr(CrossEncoderIOProcessor, name, value)
        delattr(CrossEncoderIOProcessor, scoring._WHOLE_PAIR)
        tokenizer.truncation_side = "right"
