from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import offload

BACKENDS = [
    pytest.param(("asyncio", {}), id="asyncio"),
    pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
    pytest.param(("trio", {}), id="trio"),
]


@pytest.fixture(params=BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


@pytest.fixture(params=offload.STRATEGIES)
def strategy(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def small_options(strategy: str, **extra: Any) -> dict[str, Any]:
    """Options that give each strategy a small, bounded pool for tests."""
    options: dict[str, Any] = dict(extra)
    if strategy in ("thread", "process"):
        options.setdefault("max_workers", 2)
    return options


@pytest.fixture
def executor(strategy: str) -> Iterator[offload.Executor]:
    ex = offload.get_executor(strategy, **small_options(strategy))
    try:
        yield ex
    finally:
        ex.shutdown(wait=True, cancel_futures=True)
