"""Seam: how FastAPI validates a pooling route's body against vLLM's request
union (`EmbeddingRequest` in `vllm/entrypoints/pooling/embed/protocol.py`).

`/v1/embeddings` takes a union of five request models, and FastAPI validates
the body against it on the event loop, before the handler (and admission)
runs. Pydantic's smart mode tries every member, even after one has matched.
Two members take chat messages in `input` (`EmbeddingChatInputRequest`: one
conversation; `EmbeddingBatchChatInputRequest`: a batch of them), so a body
of token ids is validated id by id against every message type: for 16 × 512
ids, 60-66 ms of the loop for a body its one matching model validates in
0.5 ms (`benchmarks/calibration/pricing.py`, `benchmarks/results/latest/pricing/pricing.md`).

Where one value in `input` (an id, a text, a list of them) fails the type a
chat member expects at that place by its type alone, that member cannot match: the body is
validated against the union without it. Its result is the full union's,
since smart mode picks among the members that match and a member that fails
changes nothing. A body the smaller union refuses is validated again by
FastAPI as before, so every error is vLLM's own, word for word.

Sound as long as those members read `input` as sent: their `mode="before"`
validators only copy a chat `input` to `messages`, and the union's own
(`reject_removed_pooling_parameters`) only refuses. `tests/vllm/test_body_validation.py`
holds the result and the errors to the full union's over generated bodies.
"""

from __future__ import annotations

import collections.abc
import itertools
import logging
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Union

from pydantic import BaseModel, TypeAdapter, ValidationError
from vllm.entrypoints.pooling.embed import protocol as embed_protocol

from .._routes import POOLING_PATHS

logger = logging.getLogger("vllm.offload_vllm")

#: The union members that take chat messages in their field `input`.
CHAT_INPUT_MEMBERS: tuple[type[BaseModel], ...] = (
    embed_protocol.EmbeddingChatInputRequest,
    embed_protocol.EmbeddingBatchChatInputRequest,
)
INPUT_FIELD = "input"

_MARK = "__offload_vllm_validation__"


@dataclass(frozen=True)
class _Shape:
    """What one level of a field holds: validated by `adapter`; a list's items by `items`."""

    adapter: TypeAdapter[Any]
    items: _Shape | None


def _shape(annotation: Any) -> _Shape:
    base = annotation
    while typing.get_origin(base) is Annotated:
        base = typing.get_args(base)[0]
    items = None
    if typing.get_origin(base) in (list, collections.abc.Sequence):
        items = _shape(typing.get_args(base)[0])
    return _Shape(TypeAdapter(annotation), items)


def _split_annotated(annotation: Any, metadata: list[Any]) -> tuple[Any, list[Any]]:
    """`annotation` without its `Annotated` layers, and their metadata, outermost
    first, before `metadata`: `Annotated[A, x]` with `[y]` is `A` with `[x, y]`."""
    outer: list[Any] = []
    while typing.get_origin(annotation) is Annotated:
        outer.extend(annotation.__metadata__)
        annotation = typing.get_args(annotation)[0]
    return annotation, [*outer, *metadata]


def _fails(shape: _Shape, value: Any) -> bool:
    """Whether `value` certainly fails `shape`: proven by one value in it that
    fails the type expected where it is, a scalar or a container of the wrong
    kind (a list where a message is expected), each refused by its type alone.
    False where none is found: not proven, not valid."""
    if isinstance(value, list) and shape.items is not None:
        return any(_fails(shape.items, item) for item in value)
    if isinstance(value, dict) and shape.items is None:
        return False  # a message: whether it is one is the union's work
    try:
        shape.adapter.validate_python(value, from_attributes=True)
    except ValidationError:
        return True
    return False


Validate = Callable[..., tuple[Any, list[Any]]]


class UnionShortcut:
    """Validates a body as FastAPI validates it against a request union
    (`annotation`, with `metadata`), without the chat-input members that one
    value in its `input` proves cannot match.

    Thread-safe: everything is built in `__init__`.
    """

    def __init__(self, annotation: Any, metadata: list[Any], config: Any = None) -> None:
        union, metadata = _split_annotated(annotation, metadata)
        members = typing.get_args(union)
        self.skippable = {
            member: _shape(member.model_fields[INPUT_FIELD].annotation)
            for member in members
            if member in CHAT_INPUT_MEMBERS
        }
        # Built once for each set of members a body can rule out (at most three).
        self._adapters: dict[frozenset[type[BaseModel]], TypeAdapter[Any]] = {}
        for n in range(1, len(self.skippable) + 1):
            for skipped in itertools.combinations(self.skippable, n):
                kept = tuple(m for m in members if m not in skipped)
                union = Union[kept]  # noqa: UP007 (a union built from a tuple)
                annotated: Any = Annotated[(union, *metadata)]
                self._adapters[frozenset(skipped)] = TypeAdapter(annotated, config=config)

    def ruled_out(self, body: Any) -> frozenset[type[BaseModel]]:
        """The chat-input members `body` cannot match, each proven by one value in its `input`."""
        if not isinstance(body, Mapping) or INPUT_FIELD not in body:
            return frozenset()
        value = body[INPUT_FIELD]
        return frozenset(member for member, shape in self.skippable.items() if _fails(shape, value))

    def validate(self, body: Any, full: Validate, *args: Any, **kwargs: Any) -> tuple[Any, list[Any]]:
        """`full(body, *args, **kwargs)`'s answer (FastAPI's `ModelField.validate`:
        the request and no errors, or no request and its errors), found without
        the members `body` rules out where it can be."""
        skipped = self.ruled_out(body)
        if skipped:
            try:
                return self._adapters[skipped].validate_python(body, from_attributes=True), []
            except ValidationError:
                pass  # validated again in full: vLLM's own errors, word for word
        return full(body, *args, **kwargs)


def shortcut_routes(app: Any) -> list[str]:
    """Give each pooling route of `app` whose body union holds a chat-input
    member a `UnionShortcut`; the paths given one. Idempotent."""
    from fastapi.routing import APIRoute

    paths = []
    for route in app.routes:
        if not isinstance(route, APIRoute) or route.path not in POOLING_PATHS:
            continue
        field: Any = route.body_field
        field_info: Any = getattr(field, "field_info", None)
        union, _ = _split_annotated(getattr(field_info, "annotation", None), [])
        if not any(member in CHAT_INPUT_MEMBERS for member in typing.get_args(union)):
            continue
        if not callable(getattr(field, "validate", None)):
            # A FastAPI whose body fields validate otherwise: vLLM's own validation, unchanged.
            logger.warning("offload-vllm: %s validates its body as vLLM does (FastAPI's body field changed)", route.path)
            continue
        if getattr(field.validate, _MARK, False):
            continue
        shortcut = UnionShortcut(field_info.annotation, list(field_info.metadata), getattr(field, "config", None))
        full: Validate = field.validate

        # FastAPI's other arguments (`values`, `loc`) pass through as they come.
        def validate(
            value: Any, *args: Any, _shortcut: UnionShortcut = shortcut, _full: Validate = full, **kwargs: Any
        ) -> tuple[Any, list[Any]]:
            return _shortcut.validate(value, _full, *args, **kwargs)

        setattr(validate, _MARK, True)
        # FastAPI validates a single body parameter with this field's `validate`.
        setattr(field, "validate", validate)  # noqa: B010
        paths.append(route.path)
    return paths


def shortcut_validation(args: Any, app: Any) -> None:
    """Give vLLM's pooling routes of `app` their `UnionShortcut`
    (`shortcut_routes`), once its routes are in: a hook of `_seams/app.py`."""
    for path in shortcut_routes(app):
        logger.info(
            "offload-vllm: %s validates a body whose input cannot be chat messages without the chat-input models",
            path,
        )
