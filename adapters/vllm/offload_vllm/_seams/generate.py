"""Seam: `vllm/renderers/online_renderer.py`, `OnlineRenderer.__init__`.

The generate routes (`/v1/chat/completions`, `/v1/completions`, and the
Responses API, which shares `preprocess_chat`) render through the
`OnlineRenderer`'s `renderer`: `preprocess_chat` awaits
`renderer.render_chat_async(...)`, `preprocess_cmpl` awaits
`renderer.render_cmpl_async(...)`. We let vLLM build the `OnlineRenderer`, then
give it a `StrategyRenderer`: the served renderer, but for those two
methods, which the strategy runs (`_placements`, `render_generate`). Streaming
and non-streaming requests share this render.

Admission (`install_admission`): `OpenAIServingChat.create_chat_completion`,
`OpenAIServingCompletion.create_completion` and
`OpenAIServingResponses.create_responses` run inside the request's
admission, as a pooling `__call__` does (`serving.admitting`): priced by its
messages, prompts or input items, images by their headers, tools, documents,
instructions and template arguments; its engine requests are its prompts
times `n` (a Responses request: one). A Responses request with
`previous_response_id` is priced without the stored conversation it
continues (not in its body), and one with `background` holds what it was
admitted with only until it is queued (its answer). A refusal is
raised (`Refusal`) for the door to send, as vLLM's router would take a
returned response for a stream. What it was
admitted with is held until its answer's last byte is sent (a stream's
last chunk), as the door's `HoldUntilAnswered` holds every admitted route. Only text: a prompt or message
with other content (images, audio, embeddings) is rendered by vLLM's own
async methods, as without the adapter (its multimodal processor cache lives
in the served renderer). Detokenization and output processing stay in vLLM.

A message's content that vLLM's request validation could not read as a list
of parts is a one-shot iterator (pydantic's `ValidatorIterator`), which vLLM
alone reads, and so validates, in its render. We read it into a list first
(`listed_contents`), raising the same validation error vLLM alone answers
with, rather than one of pickling it for a worker process; and a list's parts
are what `text_only_chat` can see.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from starlette.responses import Response
from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
from vllm.entrypoints.openai.responses.serving import OpenAIServingResponses
from vllm.renderers.chat_utils import has_non_text_content
from vllm.renderers.online_renderer import OnlineRenderer

from .. import _phases as phases
from .._admission import Refusal, RequestPolicy
from . import serving as serving_seam

#: `render(method, args, kwargs)`: the strategy's run of `renderer.<method>(*args, **kwargs)`,
#: where method is `render_chat` or `render_cmpl` (vLLM's synchronous ones).
RenderGenerate = Callable[[str, tuple[Any, ...], dict[str, Any]], Coroutine[Any, Any, Any]]

_ORIGINAL_INIT: Callable[..., None] = OnlineRenderer.__init__


class StrategyRenderer:
    """The served renderer, its text renders run by the strategy."""

    def __init__(self, served: Any, render: RenderGenerate) -> None:
        self._served = served
        self._render = render

    def __getattr__(self, name: str) -> Any:
        return getattr(self._served, name)

    # The request's render phase (`_phases.py`): both renders, the strategy's and vLLM's own.
    @phases.timing_render
    async def render_chat_async(self, conversations: Any, chat_params: Any, tok_params: Any = None, **kwargs: Any) -> Any:
        conversations = listed_contents(conversations)
        if not text_only_chat(conversations):
            return await self._served.render_chat_async(conversations, chat_params, tok_params, **kwargs)
        return await self._render("render_chat", (conversations, chat_params, tok_params), kwargs)

    @phases.timing_render
    async def render_cmpl_async(self, prompts: Any, tok_params: Any = None, **kwargs: Any) -> Any:
        if not text_only_prompts(prompts):
            return await self._served.render_cmpl_async(prompts, tok_params, **kwargs)
        return await self._render("render_cmpl", (prompts, tok_params), kwargs)


def listed_contents(conversations: Any) -> list[list[Any]]:
    """`conversations`, each message whose content is an iterator copied with that content listed."""
    return [
        [
            {**message, "content": list(message["content"])}
            if isinstance(message, dict) and isinstance(message.get("content"), Iterator)
            else message
            for message in conversation
        ]
        for conversation in conversations
    ]


def text_only_chat(conversations: Any) -> bool:
    return not any(has_non_text_content(list(conversation)) for conversation in conversations)


def text_only_prompts(prompts: Any) -> bool:
    """Parsed completion prompts that are text or token ids, nothing else."""
    for prompt in prompts:
        if not isinstance(prompt, dict):  # bytes: prompt embeddings
            return False
        if set(prompt) - {"prompt", "prompt_token_ids", "cache_salt"}:
            return False
    return True


def render(renderer: Any, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """vLLM's own synchronous render, `renderer.render_chat` or `render_cmpl`."""
    return getattr(renderer, method)(*args, **kwargs)


async def render_async(renderer: Any, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """vLLM's own async render (`render_chat_async`, `render_cmpl_async`) of the served renderer."""
    return await getattr(renderer, f"{method}_async")(*args, **kwargs)


def install(make_render: Callable[[Any], RenderGenerate | None]) -> None:
    """`make_render(served_renderer)` gives a new `OnlineRenderer` its text render (`None`: vLLM's own)."""
    if getattr(OnlineRenderer.__init__, "__offload_vllm__", False):
        return

    @functools.wraps(_ORIGINAL_INIT)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _ORIGINAL_INIT(self, *args, **kwargs)
        made = make_render(self.renderer)
        if made is not None:
            self.renderer = StrategyRenderer(self.renderer, made)

    __init__.__offload_vllm__ = True  # type: ignore[attr-defined]
    OnlineRenderer.__init__ = __init__  # type: ignore[method-assign]


#: The generate routes' handlers admission wraps: `(class, method name)`.
_HANDLERS: tuple[tuple[type, str], ...] = (
    (OpenAIServingChat, "create_chat_completion"),
    (OpenAIServingCompletion, "create_completion"),
    (OpenAIServingResponses, "create_responses"),
)


def install_admission(policy: RequestPolicy) -> None:
    """Admit every chat, completion and Responses request by `policy` before it is rendered."""
    for cls, name in _HANDLERS:
        own = vars(cls)[name]
        if not getattr(own, "__offload_vllm__", False):
            setattr(cls, name, _raising_refusals(serving_seam.admitting(own, policy, takes_images=lambda serving: False)))


def _raising_refusals(handler: Callable[..., Coroutine[Any, Any, Any]]) -> Callable[..., Coroutine[Any, Any, Any]]:
    """`handler`, admission's refusal raised as a `Refusal`: returned, vLLM's
    router would take the response for a stream's generator."""

    @functools.wraps(handler)
    async def refusing(self: Any, *args: Any, **kwargs: Any) -> Any:
        answer = await handler(self, *args, **kwargs)
        if isinstance(answer, Response):  # a handler's own answers are vLLM's models or a generator
            raise Refusal(answer)
        return answer

    refusing.__offload_vllm__ = True  # type: ignore[attr-defined]
    return refusing
