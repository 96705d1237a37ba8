"""How the tests start Ray: small, and on loopback only.

Import this before `ray`: Ray reads the environment at import.
"""

from __future__ import annotations

import os
from typing import Any

# Ray otherwise advertises the host's outward address for every node and
# worker; with this, Ray's own choice is the loopback address (Ray uses this
# switch for single-host setups on macOS and Windows).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
# A raylet waits for its node's Python agents (metrics, runtime env) and
# aborts when they are slow to start, as they can be on a busy two-core
# machine. Start-up time is not what these tests measure.
os.environ.setdefault("RAY_agent_register_timeout_ms", "120000")

#: Per node: enough logical CPUs for the suite's pools (one CPU per actor), the
#: smallest object store Ray accepts comfortably, and every address on loopback.
NODE: dict[str, Any] = {"object_store_memory": 100 << 20}

#: `ray.init` options of a test's own local instance (`ray_init_options`).
LOCAL_RAY_OPTIONS: dict[str, Any] = {
    **NODE,
    "num_cpus": 8,
    "include_dashboard": False,
    "_node_ip_address": "127.0.0.1",
    "configure_logging": False,
}

#: `ray.init(**LOCAL_RAY)`: a new local instance, whatever else runs here.
#: Without an address Ray joins the cluster started last on this machine
#: (`ray start`, or `ray.cluster_utils.Cluster` as the vLLM suite under `ray`
#: starts one, when both suites run at once) and then refuses `num_cpus`.
LOCAL_RAY: dict[str, Any] = {"address": "local", **LOCAL_RAY_OPTIONS}
