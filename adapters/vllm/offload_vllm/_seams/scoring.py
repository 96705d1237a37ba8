"""Seam: `vllm/entrypoints/pooling/scoring/io_processor.py`, `CrossEncoderIOProcessor`.

A cross-encoder renders each (query, document) pair with `render`, which
tokenizes it in `get_score_prompt` with one call,
`tokenizer(text=query, text_pair=document, **tok_params.get_encode_kwargs())`,
and then cuts it (`tok_params.apply_post_tokenization`). With prefix
tokenization installed, `get_score_prompt` tokenizes a text pair by prefix
(`_prefix.encode_pair_truncated`) where vLLM would take that call: no chat
or score template, a separator token, no per-query or per-document token
limit (`max_tokens_per_query`, `max_tokens_per_doc`: vLLM cuts those texts
itself first). `render` is wrapped only to hand `get_score_prompt` the
request's `TokenizeParams`, which it does not receive; `render` drops the
prompt text `get_score_prompt` returns, so the prefix path returns none
(an empty string) rather than decode the ids.

A bi-encoder or late-interaction model's `/score` tokenizes each side as a
prompt of its own, through the renderer (`renderer.install_prefix_tokenization`).
"""

from __future__ import annotations

import contextvars
from typing import Any

from .. import _prefix

_WHOLE_PAIR = "_offload_vllm_whole_pair_tokenize"

#: The `TokenizeParams` of the pair `render` is rendering in this context.
_tok_params: contextvars.ContextVar[Any] = contextvars.ContextVar("offload_vllm_pair_tok_params", default=None)


def pair_truncation(tok_params: Any, tokenizer: Any) -> tuple[int | None, _prefix.Side, int | None]:
    """How vLLM cuts a pair's output after the tokenizer: (the tokens it keeps,
    `None` for all; from which side; the count the pair was priced by, `None`
    where it was priced whole) (`TokenizeParams._truncation_slice`)."""
    keep = tok_params.truncate_prompt_tokens
    priced = keep if type(keep) is int and keep > 0 else None
    if keep is not None and keep < 0:
        keep = tok_params.max_truncation_tokens
    side = tok_params.truncation_side or tokenizer.truncation_side
    return keep, ("left" if side == "left" else "right"), priced


_announced = False


def _announce() -> None:
    """Say once per process that a text pair was tokenized by prefix."""
    global _announced
    if not _announced:
        _announced = True
        _prefix.logger.info("offload-vllm: prefix tokenization on for text pairs (cross-encoder)")


def install_pair_prefix_tokenization() -> None:
    """Make every cross-encoder in this process tokenize a truncated text
    pair by prefix: `CrossEncoderIOProcessor.render` and `get_score_prompt`
    replaced on the class. Idempotent. The ids, token type ids and so the
    scores and `usage` are exactly vLLM's; any pair the prefix path does not
    settle is tokenized whole, by vLLM's method."""
    from vllm import TokensPrompt
    from vllm.entrypoints.pooling.scoring.io_processor import CrossEncoderIOProcessor
    from vllm.entrypoints.pooling.scoring.utils import parse_score_data

    if hasattr(CrossEncoderIOProcessor, _WHOLE_PAIR):
        return
    whole_render = CrossEncoderIOProcessor.render
    whole = CrossEncoderIOProcessor.get_score_prompt

    def render(self: Any, render_params: Any) -> Any:
        token = _tok_params.set(render_params.get("tok_params") if isinstance(render_params, dict) else None)
        try:
            return whole_render(self, render_params)
        finally:
            _tok_params.reset(token)

    def get_score_prompt(
        self: Any,
        data_1: Any,
        data_2: Any,
        encode_kwargs: dict[str, Any],
        chat_template: str | None = None,
        max_tokens_per_query: int = 0,
        max_tokens_per_doc: int = 0,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> Any:
        tok_params = _tok_params.get()
        if (
            tok_params is not None
            and type(data_1) is str
            and type(data_2) is str
            and chat_template is None
            and not self.supports_score_template
            and self.use_sep_token
            and max_tokens_per_query <= 0
            and max_tokens_per_doc <= 0
        ):
            query, document, mm_data, _ = parse_score_data(data_1, data_2, self.model_config)
            if mm_data is None:
                keep, side, priced = pair_truncation(tok_params, self.tokenizer)
                encoded = _prefix.encode_pair_truncated(
                    self.tokenizer, query, document, encode_kwargs, keep, side, priced
                )
                if encoded is not None:
                    _announce()
                    engine_prompt = TokensPrompt(prompt_token_ids=encoded["input_ids"])
                    if "token_type_ids" in encoded:
                        engine_prompt["token_type_ids"] = encoded["token_type_ids"]
                    # No decoded text: `render`, the one caller that sets `_tok_params`,
                    # drops it, and decoding a pair's ids costs ~40% of tokenizing it.
                    return "", engine_prompt
        return whole(
            self, data_1, data_2, encode_kwargs, chat_template, max_tokens_per_query, max_tokens_per_doc,
            chat_template_kwargs,
        )

    setattr(CrossEncoderIOProcessor, _WHOLE_PAIR, whole)
    CrossEncoderIOProcessor.render = render  # type: ignore[method-assign]
    CrossEncoderIOProcessor.get_score_prompt = get_score_prompt  # type: ignore[method-assign]
