"""Answers of vLLM's generate routes as the tests compare them: without what
differs between two servers (ids, times), a stream folded into one answer."""

from __future__ import annotations

import json
from typing import Any


def without_ids(answer: Any) -> Any:
    """The answer but what differs between any two servers (its id, its time)."""
    if isinstance(answer, dict):
        return {k: without_ids(v) for k, v in answer.items() if k not in ("id", "created")}
    if isinstance(answer, list):
        return [without_ids(v) for v in answer]
    return answer


def events(text: str) -> list[dict[str, Any]]:
    """A streamed answer's chunks, from its server-sent events (ending `[DONE]`)."""
    data = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(chunk) for chunk in data[:-1]]


#: A streamed choice's fields that a chunk continues: joined across chunks.
_JOINED = ("content", "text", "token_ids")


def folded(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """A stream as one answer: each choice's text, token ids and logprobs joined
    over the chunks, every other field (role, prompt token ids, finish reason, usage) its
    value where it is set; ids and times left out (`without_ids`)."""
    top: dict[str, Any] = {}
    choices: dict[int, dict[str, Any]] = {}
    for chunk in without_ids(chunks):
        for key, value in chunk.items():
            if key == "choices":
                for choice in value:
                    _fold(choices.setdefault(choice["index"], {}), choice)
            elif value is not None:
                assert top.setdefault(key, value) == value, (key, top[key], value)
    return {**top, "choices": [choices[i] for i in sorted(choices)]}


def _fold(into: dict[str, Any], part: dict[str, Any]) -> None:
    for key, value in part.items():
        if isinstance(value, dict):
            _fold(into.setdefault(key, {}), value)
        elif key in _JOINED and value is not None:
            into[key] = into.get(key, value[:0]) + value
        elif value is not None:
            assert into.setdefault(key, value) == value, (key, into[key], value)
