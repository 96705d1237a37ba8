"""Seam: `vllm/entrypoints/pooling/scoring/serving.py`'s `JSONResponse`, with which
`ServingScores` builds the body of every `/score` and `/rerank` answer
(`JSONResponse(content=response.model_dump())`).

Starlette's `JSONResponse` encodes with `json.dumps(ensure_ascii=False,
allow_nan=False, separators=(",", ":"))`, then UTF-8. A rerank answer
echoes every document's text, so that encoding grows with the request;
pydantic-core's encoder (`pydantic_core.to_json`, a vLLM dependency through
pydantic) writes the same JSON several times faster. `install_response_encoder` makes the module's
`JSONResponse` a subclass whose `render` takes pydantic-core's bytes where
they are Starlette's own, byte for byte, and Starlette's everywhere else
(`same_bytes_in_pydantic_core`).
"""

from __future__ import annotations

from typing import Any, final

import pydantic_core
from fastapi.responses import JSONResponse
from vllm.entrypoints.pooling.scoring import serving as scoring_serving

#: pydantic-core writes a finite float as Python's `repr` does from here up
#: to `_REPR_AS_IS_BELOW`; below it, Python writes an exponent (`1e-05`)
#: where pydantic-core does not (`0.00001`).
_REPR_AS_IS_FROM = 1e-4
#: From here Python writes an exponent (`1e+16`); pydantic-core then does too,
#: but only this range and zero were checked float by float (`tests/vllm/test_responses.py`).
_REPR_AS_IS_BELOW = 1e16


def same_bytes_in_pydantic_core(content: Any) -> bool:
    """Whether `pydantic_core.to_json(content)` is what Starlette's `JSONResponse`
    renders `content` as, byte for byte, unless it raises: `content` holds only
    dicts with string keys, lists, strings, ints, bools, `None` and finite
    floats that Python writes without an exponent (zero, or 1e-4 to 1e16 in
    absolute value). Both escape `"`, `\\\\` and the characters below U+0020
    alike and write every other character as UTF-8 (a string UTF-8 cannot
    encode, a lone surrogate, makes both raise). Walked a level at a time,
    in work bounded per item: strings are not read."""
    level: list[Any] = [content]
    while level:
        below: list[Any] = []
        for item in level:
            kind = type(item)
            if kind is str or kind is int or kind is bool or item is None:
                continue
            if kind is float:
                size = abs(item)
                if not (size == 0.0 or _REPR_AS_IS_FROM <= size < _REPR_AS_IS_BELOW):  # NaN fails both
                    return False
            elif kind is dict:
                if any(type(key) is not str for key in item):
                    return False
                below += item.values()
            elif kind is list:
                below += item
            else:
                return False
        level = below
    return True


@final
class ScoringJSONResponse(JSONResponse):
    """Starlette's `JSONResponse`, rendered by pydantic-core where that gives the same bytes."""

    def render(self, content: Any) -> bytes:
        if same_bytes_in_pydantic_core(content):
            try:
                return pydantic_core.to_json(content)
            except pydantic_core.PydanticSerializationError:
                pass  # a lone surrogate: Starlette's own error follows
        return super().render(content)


def install_response_encoder() -> None:
    """Build every scoring answer's body with `ScoringJSONResponse`. Idempotent."""
    setattr(scoring_serving, "JSONResponse", ScoringJSONResponse)  # noqa: B010 (a name vLLM does not export)
