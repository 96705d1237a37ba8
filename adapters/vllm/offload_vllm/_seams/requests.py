"""Seam: the fields of vLLM's pooling requests (`vllm/entrypoints/pooling/*/protocol.py`)
and render parameters (`vllm/entrypoints/pooling/typing.py`) that hold a
request's inputs, and its engine `priority`.

What a request costs (`_cost.py`) is read from these fields before anything
is rendered: a scoring request (`/score`, `/rerank`) costs its pairs, query
× documents; any other request, the inputs in `INPUT_FIELDS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm.entrypoints.pooling.scoring.protocol import RerankRequest, ScoringRequestMixin

from .._cost import (
    HTTP_URL,
    PROMPT_COST,
    URL_IMAGE_COST,
    body_floor,
    characters,
    inputs_cost,
    pairs_cost,
    truncated_cap,
)
from .renderer import prefix_installed

#: The fields of a pooling request that may hold its inputs: `input` (texts or
#: token ids: embeddings, pooling, classify), `texts`, `images`, `inputs`
#: (`/v2/embed`: exactly one is set), `data` (IO processor plugins). A chat form
#: holds its conversation(s) in `messages`, which wins: vLLM copies a chat
#: `input` there.
INPUT_FIELDS = ("input", "texts", "images", "inputs", "data")

#: The keys of render parameters that hold the prompt: a completion's parsed
#: prompt, a chat's conversation, a scoring pair.
RENDER_INPUT_KEYS = ("prompts", "conversations", "data_1", "data_2")


#: The fields of a pooling request that shape its rendering and count their
#: characters too: a chat template sent with the request, the arguments of
#: the template and of the multimodal processor.
TEMPLATE_FIELDS = ("chat_template", "chat_template_kwargs", "mm_processor_kwargs")


def request_cost(request: Any, content_length: int = 0) -> float:
    """What rendering `request` costs, in characters (`_cost.py`), read from its
    fields alone: cheap, and before anything is rendered; at least `body_floor`
    of `content_length`, its body's bytes. Raises `TooDeep` for inputs nested
    past `MAX_DEPTH`."""
    cost = _inputs_cost(request) + sum(characters(getattr(request, name, None)) for name in TEMPLATE_FIELDS)
    return max(cost, body_floor(content_length))


def _inputs_cost(request: Any) -> float:
    if isinstance(request, RerankRequest):
        return pairs_cost(request.query, request.documents)
    if isinstance(request, ScoringRequestMixin):  # every form of ScoreRequest names its sides so
        return pairs_cost(request.data_1, request.data_2)  # type: ignore[attr-defined]
    messages = getattr(request, "messages", None)
    if messages is not None:
        # One conversation (a list of messages), or a batch of them (a list of lists).
        conversations = len(messages) if messages and isinstance(messages[0], (list, tuple)) else 1
        return float(characters(messages) + PROMPT_COST * conversations)
    # A truncated text is tokenized only as far as its kept tokens need (prefix tokenization).
    cap = truncated_cap(getattr(request, "truncate_prompt_tokens", None)) if prefix_installed() else None
    cost = sum(inputs_cost(getattr(request, name, None), cap) for name in INPUT_FIELDS)
    # `/v2/embed`'s `images` are URLs: one fetched over http(s) is priced before it is.
    images = getattr(request, "images", None) or ()
    return cost + URL_IMAGE_COST * sum(1 for url in images if isinstance(url, str) and url.startswith(HTTP_URL))


def render_params_cost(render_params: Mapping[str, Any]) -> float:
    """What rendering one prompt's render parameters costs (a scoring pair's
    query and document together); a truncated text prompt's as `request_cost` prices it."""
    cap = None
    if "prompts" in render_params and prefix_installed():
        cap = truncated_cap(getattr(render_params.get("tok_params"), "truncate_prompt_tokens", None))
    return float(sum(characters(render_params.get(key), cap) for key in RENDER_INPUT_KEYS) + PROMPT_COST)


def prompt_cost(prompt: Any, tok_params: Any) -> float:
    """What tokenizing one text prompt with `tok_params` costs (`async-renderer`'s calls)."""
    cap = truncated_cap(getattr(tok_params, "truncate_prompt_tokens", None)) if prefix_installed() else None
    return characters(prompt, cap)


def sets_own_priority(request: Any) -> bool:
    """Whether the client gave `request` a `priority` of its own."""
    return "priority" in getattr(request, "model_fields_set", ())


def set_engine_priority(request: Any, priority: int) -> None:
    """Make `priority` the engine priority of `request`'s prompts (vLLM copies
    the request's `priority` onto each prompt it sends the engine)."""
    request.priority = priority
