"""pytest plugin: offload's contract suite (`tests/`) against the `ray` strategy.

`make test-ray` runs the core suite's contract files with `-p ray_contract` and
`OFFLOAD_TEST_STRATEGIES=ray`: every executor the suite builds joins the one
local Ray instance started here, as an application that already called
`ray.init` would.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ray_settings import LOCAL_RAY  # sets Ray's environment: before `import ray`

# isort: split
import ray


@pytest.fixture(scope="session", autouse=True)
def _local_ray() -> Iterator[None]:
    ray.init(**LOCAL_RAY)
    try:
        yield
    finally:
        ray.shutdown()
