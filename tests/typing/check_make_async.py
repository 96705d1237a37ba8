"""Type-level checks (run by `mypy --strict`, never executed): make_async keeps signatures."""

from __future__ import annotations

from typing_extensions import assert_type

import offload


def tokenize(text: str, *, add_special_tokens: bool = True) -> list[int]:
    return [len(text)]


bare = offload.make_async(tokenize)


@offload.make_async(strategy="thread", max_workers=4)
def decorated(x: int, y: float = 1.0) -> str:
    return str(x * y)


called = offload.make_async(tokenize, strategy="inline")


async def use_them(ex: offload.Executor) -> None:
    assert_type(await bare("hi"), list[int])
    assert_type(await decorated(1, y=2.0), str)
    assert_type(await called("a", add_special_tokens=False), list[int])
    assert_type(await ex.run(tokenize, "x"), list[int])
    assert_type(ex.submit(tokenize, "x").result(), list[int])
