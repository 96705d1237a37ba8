"""For a benchmark row only: sets the GIL's switch interval from
`$OFFLOAD_BENCH_SWITCH_INTERVAL` (seconds) in every process started with this
folder on its `PYTHONPATH` (Python imports `sitecustomize` at start), so a
row can measure what a shorter interval does for the event loop's wait for
the GIL beside worker threads. Not a setting of offload's."""

import os
import sys

_interval = os.environ.get("OFFLOAD_BENCH_SWITCH_INTERVAL")
if _interval:
    sys.setswitchinterval(float(_interval))
