"""offload's contract suite (`offload.testing.StrategyContract`) against the
`ray` strategy: every executor the suite builds joins the one local Ray
instance started here, as an application that already called `ray.init` would."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ray_settings import LOCAL_RAY  # sets Ray's environment: before `import ray`

# isort: split
import ray

from offload.testing import StrategyContract


@pytest.fixture(scope="module", autouse=True)
def _local_ray() -> Iterator[None]:
    ray.init(**LOCAL_RAY)
    try:
        yield
    finally:
        ray.shutdown()


class TestRayContract(StrategyContract):
    strategy_name = "ray"
