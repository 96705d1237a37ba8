"""For a benchmark row only: with `$OFFLOAD_BENCH_LOOP_WAKEUP` set to
`call_soon_threadsafe`, every process started with this folder on its
`PYTHONPATH` (Python imports `sitecustomize` at start) has offload wake its
event loop from worker threads with `loop.call_soon_threadsafe`, as it did
before its doorbell (`offload/_waiter.py`), so a row can measure what the
doorbell buys under uvloop. Not a setting of offload's."""

import os

if os.environ.get("OFFLOAD_BENCH_LOOP_WAKEUP") == "call_soon_threadsafe":
    from offload import _waiter

    _waiter._doorbell = lambda loop: None  # type: ignore[assignment]
