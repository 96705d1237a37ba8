from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The helpers beside this file (ray_settings) import by name.
sys.path.insert(0, str(Path(__file__).parent))

import ray_settings  # sets Ray's environment before any test imports ray

# isort: split
import ray

from offload.testing import BACKENDS


@pytest.fixture(params=BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


@pytest.fixture(scope="session")
def _shared_local_ray() -> Iterator[None]:
    """Shuts down, at the end of the run, the local instance `local_ray` started;
    not between modules: once, shut down before test_ray_failures, this process
    was connected to a new local instance within seconds (by what, not found),
    whose GCS then went away, and Ray ended the process (exit 1)."""
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def local_ray(_shared_local_ray: None) -> None:
    """A local Ray instance (`ray_settings.LOCAL_RAY`) for the module, started once
    and shared by the modules that ask for it (starting one took 10-20 s on a busy
    two-core machine); a module that ended it (the cluster's) leaves the next to
    start another."""
    if not ray.is_initialized():
        ray.init(**ray_settings.LOCAL_RAY)


@pytest.fixture(scope="module")
def no_local_ray() -> None:
    """No Ray connection in this process: for a module whose tests start Ray their own way."""
    ray.shutdown()
