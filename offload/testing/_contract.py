"""`StrategyContract`: the rules every strategy obeys, as pytest tests.

The tests live by concern, one mixin each (`_contract_calls`,
`_contract_queue`, `_contract_admission`, `_contract_lifecycle`), on the
fixtures of `_contract_base`; this class composes them.
"""

from __future__ import annotations

from ._contract_admission import AdmissionContract
from ._contract_base import BACKENDS, _peak_concurrency
from ._contract_calls import CallsContract
from ._contract_lifecycle import LifecycleContract
from ._contract_queue import QueueContract

__all__ = ["BACKENDS", "StrategyContract", "_peak_concurrency"]


class StrategyContract(CallsContract, QueueContract, AdmissionContract, LifecycleContract):
    """The contract suite: subclass it in a test module, name the strategy, run pytest.

        from offload.testing import StrategyContract

        class TestPool(StrategyContract):
            strategy_name = "pool"

    The strategy must be registered under that name (an entry point in the
    group `offload.strategies`; `pip install -e .` of the plugin does it).
    Each test builds its own executors (`offload.get_executor(name,
    **options)`) and runs on asyncio, and on uvloop and trio where installed.

    The tests skip by what a strategy declares or does, never by its name:
    no queue (`capacity()` is `None`): no cancellation of queued calls, no
    `max_queue`, no lanes; calls that run on the caller's thread: no
    cancellation or timeout of a running call; `carries_context = False`: no
    `contextvars`, no local functions; `replaces_crashed_workers = True`: a
    worker killed mid-call fails that call with `WorkerCrashed`, the calls
    beside it finish (`crash_fails_running_calls = True`: or fail with
    `WorkerCrashed` too), and the next call runs. Metrics are checked where `prometheus_client` is installed;
    Hypothesis drives the value tests where installed (else fixed examples).
    Functions the tests run live in `offload.testing._functions`, importable
    by name in a worker process. A failure shows its values (pytest rewrites
    the suite's assertions); the suite keeps Hypothesis's files out of the
    folder pytest runs in (see docs/strategies, "Check it").
    """
