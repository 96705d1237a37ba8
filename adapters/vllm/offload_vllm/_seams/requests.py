"""Seam: the fields of vLLM's pooling requests (`vllm/entrypoints/pooling/*/protocol.py`)
and render parameters (`vllm/entrypoints/pooling/typing.py`) that hold a
request's inputs, and its engine `priority`.

What a request costs (`_cost.py`) is read from these fields before anything
is rendered: a scoring request (`/score`, `/rerank`) costs its pairs, query
× documents; any other request, the inputs in `INPUT_FIELDS`.

A string is priced as an image (`_cost.image_cost`) only in a field vLLM
loads images from (`IMAGE_FIELDS`, `_cost.Images`): a chat form's
`image_url` content parts, on every model (vLLM's chat parser loads each
image before it checks that the model takes images: a 4,000² PNG cost
0.18 s to be refused on MiniLM); `/v2/embed`'s `images`, which vLLM turns
into such parts; and, on a multimodal model (`takes_images`) only, the
content parts of scoring inputs (vLLM refuses them for any other model
before loading them). Every other string, a text input beginning
`data:image/` included, is its characters.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from typing import Any

from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
from vllm.entrypoints.pooling.embed.protocol import CohereEmbedRequest
from vllm.entrypoints.pooling.scoring.protocol import RerankRequest, ScoringRequestMixin

from .._cost import (
    PROMPT_COST,
    Images,
    PricedTexts,
    body_floor,
    characters,
    inputs_cost,
    pair_cost,
    pairs_cost,
    prompts,
    truncated_cap,
)
from .renderer import pair_prefix_installed, prefix_installed

#: The fields of a pooling request that may hold its inputs: `input` (texts or
#: token ids: embeddings, pooling, classify), `texts`, `images`, `inputs`
#: (`/v2/embed`: exactly one is set), `data` (IO processor plugins), and a
#: completion's `prompt` (texts or token ids). A chat form holds its
#: conversation(s) in `messages`, which wins: vLLM copies a chat `input` there.
INPUT_FIELDS = ("input", "texts", "images", "inputs", "data", "prompt")

#: The fields of `INPUT_FIELDS` whose strings may be images (`Images`); the
#: others are text. An IO processor plugin's `data` is text: the plugin reads
#: it in a format of its own, which the adapter cannot know.
IMAGE_FIELDS: Mapping[str, Images] = {"images": Images.EVERY, "inputs": Images.PARTS}

#: The keys of render parameters that hold the prompt: a completion's parsed
#: prompt, a chat's conversation, a scoring pair.
RENDER_INPUT_KEYS = ("prompts", "conversations", "data_1", "data_2")


#: The fields of a request that shape its rendering and count their
#: characters too: a chat template sent with the request, the arguments of
#: the template and of the multimodal processor.
TEMPLATE_FIELDS = ("chat_template", "chat_template_kwargs", "mm_processor_kwargs")

#: A chat's fields that its template renders too: its tools and documents
#: (counted for a request with `messages` only: a rerank's `documents` are its inputs).
CHAT_FIELDS = ("tools", "documents")

#: A Responses API request's fields that its chat template renders beside its
#: input: its instructions (the system message) and tools.
RESPONSES_FIELDS = ("instructions", "tools")


#: The truncated texts and text pairs priced so far in the request being served (`pricing_texts`).
_priced_texts: contextvars.ContextVar[PricedTexts | None] = contextvars.ContextVar(
    "offload_vllm_priced_texts", default=None
)


@contextlib.contextmanager
def pricing_texts() -> Iterator[None]:
    """Within it, a truncated text or a text pair priced once (at admission,
    `request_cost`) is not read again when its render parameters are priced
    (`render_params_cost`) nor when a prompt of it is (`prompt_cost`): one
    request's texts and pairs, kept until it ends (`_cost.PricedTexts`), the
    same prices read once. Entered again within itself, it keeps them."""
    if _priced_texts.get() is not None:
        yield
        return
    token = _priced_texts.set(PricedTexts())
    try:
        yield
    finally:
        _priced_texts.reset(token)


def takes_images(serving: Any) -> bool:
    """Whether the model `serving` (a pooling serving object) serves is
    multimodal: vLLM loads the images of scoring inputs for it alone."""
    return bool(serving.model_config.is_multimodal_model)


def request_cost(request: Any, content_length: int = 0, *, multimodal: bool = False) -> float:
    """What rendering `request` costs, in characters (`_cost.py`), read from its
    fields alone: cheap, and before anything is rendered; at least `body_floor`
    of `content_length`, its body's bytes. `multimodal`: the model takes
    images (`takes_images`). Raises `TooDeep` for inputs nested past `MAX_DEPTH`."""
    fields: tuple[str, ...]
    if isinstance(request, ResponsesRequest):
        fields = TEMPLATE_FIELDS + RESPONSES_FIELDS
    elif getattr(request, "messages", None) is not None:
        fields = TEMPLATE_FIELDS + CHAT_FIELDS
    else:
        fields = TEMPLATE_FIELDS
    cost = _inputs_cost(request, multimodal) + sum(characters(getattr(request, name, None)) for name in fields)
    return max(cost, body_floor(content_length))


def engine_requests(request: Any) -> int:
    """The engine requests `request` makes, at least (what vLLM's
    `--max-num-queued-reqs` counts: one per prompt it hands the engine), read
    from its fields as `request_cost` reads them: one per input, per
    conversation, and for a scoring request one per text of either side (a
    cross-encoder makes one per pair, a bi-encoder one per text: never more
    than the texts). A long input that vLLM's chunked processing
    (`--pooler-config '{"enable_chunked_processing": true}'`) cuts into
    several engine requests is counted once."""
    if isinstance(request, ResponsesRequest):
        return 1  # one conversation, whatever its items
    if isinstance(request, ScoringRequestMixin):
        if isinstance(request, RerankRequest):
            return 1 + prompts(request.documents)
        return prompts(request.data_1) + prompts(request.data_2)  # type: ignore[attr-defined]
    # A generate request's `n` choices are each an engine request (vLLM's own count at its check).
    choices = getattr(request, "n", None) or 1
    messages = getattr(request, "messages", None)
    if messages is not None:
        return choices * (len(messages) if messages and isinstance(messages[0], (list, tuple)) else 1)
    return choices * max(1, sum(prompts(getattr(request, name, None)) for name in INPUT_FIELDS))


def _inputs_cost(request: Any, multimodal: bool) -> float:
    if isinstance(request, ResponsesRequest):
        # One conversation: its input items (a string, or messages whose
        # `input_image` parts carry an `image_url`) after the messages it carries on.
        conversation = (request.previous_input_messages, request.input)
        return float(characters(conversation, images=Images.PARTS) + PROMPT_COST)
    scoring_images = Images.PARTS if multimodal else Images.NONE
    if isinstance(request, ScoringRequestMixin):
        cap = _pair_cap(request.truncate_prompt_tokens, request.max_tokens_per_query, request.max_tokens_per_doc)
        whole = not pair_prefix_installed()
        priced = _priced_texts.get()
        if isinstance(request, RerankRequest):
            return pairs_cost(request.query, request.documents, scoring_images, cap, whole_pairs=whole, priced=priced)
        # Every form of ScoreRequest names its sides so.
        return pairs_cost(request.data_1, request.data_2, scoring_images, cap, whole_pairs=whole, priced=priced)  # type: ignore[attr-defined]
    messages = getattr(request, "messages", None)
    if messages is not None:
        # One conversation (a list of messages), or a batch of them (a list of lists).
        conversations = len(messages) if messages and isinstance(messages[0], (list, tuple)) else 1
        return float(characters(messages, images=Images.PARTS) + PROMPT_COST * conversations)
    # A truncated text is tokenized only as far as its kept tokens need (prefix tokenization).
    cap = truncated_cap(getattr(request, "truncate_prompt_tokens", None)) if prefix_installed() else None
    priced = _priced_texts.get()
    return sum(
        inputs_cost(getattr(request, name, None), cap, IMAGE_FIELDS.get(name, Images.NONE), priced)
        for name in INPUT_FIELDS
    )


def _pair_cap(truncate_prompt_tokens: Any, max_tokens_per_query: Any, max_tokens_per_doc: Any) -> int | None:
    """The token count a scoring request's pairs are priced by (`_cost.pairs_cost`'s
    `cap`): `None` (whole) where vLLM cuts a side's text itself first
    (`max_tokens_per_query`, `max_tokens_per_doc`: it tokenizes it whole)."""
    if not prefix_installed() or (max_tokens_per_query or 0) > 0 or (max_tokens_per_doc or 0) > 0:
        return None
    return truncated_cap(truncate_prompt_tokens)


def echoed(request: Any) -> Any:
    """What of `request` its answer carries back, for post-processing's cost:
    a rerank request's documents (vLLM's `RerankDocument`: a text, or a
    multimodal document's content parts), a Cohere-style `/v2/embed`
    request's `texts`, `None` for any other request."""
    if isinstance(request, RerankRequest):
        return request.documents
    if isinstance(request, CohereEmbedRequest):
        return request.texts
    return None


def render_params_cost(render_params: Mapping[str, Any]) -> float:
    """What rendering one prompt's render parameters costs (a scoring pair's
    query and document together); a truncated text prompt's as `request_cost`
    prices it; a text or text pair priced already within `pricing_texts`, as it was priced."""
    if "data_1" in render_params:
        cap = _pair_cap(
            getattr(render_params.get("tok_params"), "truncate_prompt_tokens", None),
            render_params.get("max_tokens_per_query"),
            render_params.get("max_tokens_per_doc"),
        )
        if cap is not None:
            whole = not pair_prefix_installed()
            priced = _priced_texts.get()
            price = pair_cost if priced is None else priced.cost
            return price(render_params["data_1"], render_params["data_2"], Images.PARTS, cap, whole) + PROMPT_COST
    cap = None
    if "prompts" in render_params and prefix_installed():
        cap = truncated_cap(getattr(render_params.get("tok_params"), "truncate_prompt_tokens", None))
    # A chat's conversation and a scoring pair's content parts reach rendering
    # only where vLLM loads their images (a scoring side's parts are refused
    # before for a model that takes none): priced as parts.
    priced = _priced_texts.get()
    return float(
        sum(characters(render_params.get(key), cap, Images.PARTS, priced) for key in RENDER_INPUT_KEYS) + PROMPT_COST
    )


def prompt_cost(prompt: Any, tok_params: Any) -> float:
    """What tokenizing one text prompt with `tok_params` costs (`async-renderer`'s calls)."""
    cap = truncated_cap(getattr(tok_params, "truncate_prompt_tokens", None)) if prefix_installed() else None
    return characters(prompt, cap, priced=_priced_texts.get())


def sets_own_priority(request: Any) -> bool:
    """Whether the client gave `request` a `priority` of its own."""
    return "priority" in getattr(request, "model_fields_set", ())


def set_engine_priority(request: Any, priority: int) -> None:
    """Make `priority` the engine priority of `request`'s prompts (vLLM copies
    the request's `priority` onto each prompt it sends the engine)."""
    request.priority = priority
