from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

# The helpers beside this file (settings, the contract plugin) import by name.
sys.path.insert(0, str(Path(__file__).parent))

import ray_settings  # noqa: F401 (sets Ray's environment before any test imports ray)

BACKENDS = [
    pytest.param(("asyncio", {}), id="asyncio"),
    pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
    pytest.param(("trio", {}), id="trio"),
]


@pytest.fixture(params=BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param
