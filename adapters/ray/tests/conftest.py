from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

# The helpers beside this file (ray_settings) import by name.
sys.path.insert(0, str(Path(__file__).parent))

import ray_settings  # noqa: F401 (sets Ray's environment before any test imports ray)

from offload.testing import BACKENDS


@pytest.fixture(params=BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param
