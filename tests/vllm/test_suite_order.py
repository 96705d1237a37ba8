"""The suite's own order (`conftest.pytest_collection_modifyitems` and
test_offline's fixture order): the shared `servers` start only after every
module of this directory that starts servers or engines of its own is done,
so that the two never share the machine's memory (together they exhausted it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def test_the_shared_servers_start_after_every_other_server_and_engine() -> None:
    # --setup-plan: the order pytest would set fixtures up and tear them down,
    # without running a test or starting a server.
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--setup-plan", "-q", "-p", "no:cacheprovider", str(HERE)],
        capture_output=True, text=True, timeout=300, cwd=HERE.parents[1], check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    plan = [line.strip() for line in result.stdout.splitlines()]
    (servers_up,) = [i for i, line in enumerate(plan) if line.startswith("SETUP    S servers (fixtures used: ")]
    offline = [i for i, line in enumerate(plan) if line.startswith("SETUP    S offline_results")]
    module_teardowns = [i for i, line in enumerate(plan) if line.startswith("TEARDOWN M")]
    assert offline, "no offline run planned"
    assert offline[0] < servers_up, "test_offline's engines must run before the shared servers start"
    # Every module fixture (each module's own servers) is gone before the shared ones start.
    assert module_teardowns, "no module fixture planned"
    assert max(module_teardowns) < servers_up, [plan[i] for i in module_teardowns]
