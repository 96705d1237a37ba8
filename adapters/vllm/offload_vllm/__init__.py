"""offload-vllm: choose how vLLM's pooling entrypoints run pre- and post-processing.

Installed next to vLLM, this package registers `register` in vLLM's
`vllm.general_plugins` entry-point group, which vLLM calls in every process it
starts. `OFFLOAD_VLLM_STRATEGY` (else `OFFLOAD_STRATEGY`) picks the strategy;
unset, vLLM keeps its own behaviour. The settings' old names, `VLLM_OFFLOAD_*`,
still work, with a warning. See docs/vllm.md.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from ._config import ADAPTER_STRATEGIES as ADAPTER_STRATEGIES
from ._config import OffloadVLLMConfigError as OffloadVLLMConfigError
from ._config import Settings as Settings
from ._config import adopt_new_names as _adopt_new_names
from ._config import read_settings as read_settings
from ._process_role import is_worker_process
from ._seams import TESTED_VLLM_VERSIONS as TESTED_VLLM_VERSIONS
from ._seams import UnsupportedVLLMVersion as UnsupportedVLLMVersion

__version__ = "0.1.0"

__all__ = [
    "ADAPTER_STRATEGIES",
    "TESTED_VLLM_VERSIONS",
    "OffloadVLLMConfigError",
    "Settings",
    "UnsupportedVLLMVersion",
    "active_strategy",
    "read_settings",
    "register",
]

# A child of "vllm", so the message shows in vLLM's own log format and level.
logger = logging.getLogger("vllm.offload_vllm")

_active: Settings | None = None

def active_strategy() -> str | None:
    """The strategy `register` applied in this process, or `None` (vLLM's own behaviour)."""
    return None if _active is None else _active.strategy


def register() -> None:
    """vLLM's plugin hook. Validates the settings and patches the seams; idempotent.

    In one of the adapter's remote workers (a `process` worker, a Ray actor),
    where vLLM may load its plugins again, it patches nothing (`_process_role`).

    Raises:
        OffloadVLLMConfigError: a bad `OFFLOAD_VLLM_*`/`OFFLOAD_STRATEGY` value, an
            unknown `OFFLOAD_VLLM_*` or `VLLM_OFFLOAD_*` variable, or a setting whose
            new and old names disagree (vLLM does not catch it: the server stops at start).
        UnsupportedVLLMVersion: a strategy is set and this vLLM lacks a seam.
    """
    global _active
    if is_worker_process():
        return
    settings = read_settings()
    if _active is not None:
        if _active != settings:
            raise OffloadVLLMConfigError(f"offload-vllm already registered with {_active}, now {settings}")
        return
    legacy_warning = settings.legacy_warning()
    if legacy_warning is not None:
        logger.warning("%s", legacy_warning)
        # The processes vLLM starts next (engine core, workers) inherit the new
        # names: one warning per server, not one per process. In the API server
        # vLLM checks its VLLM_* variables after loading plugins, so it does not
        # warn about ours either.
        _adopt_new_names(settings)
    if settings.strategy is None:
        _active = settings
        logger.debug("offload-vllm: no strategy set; vLLM keeps its own behaviour")
        return

    from ._seams import require_supported_vllm

    version = require_supported_vllm()
    from ._config import HEALTH_PORT_ENV
    from ._health import Health
    from ._phases import TimePhases
    from ._retry_after import DrainRates
    from ._runtime import Runtime
    from ._seams import admission, io_processor, offline, serving, validation
    from ._seams import app as app_seam

    # async-renderer's window is spent only while other requests are in flight.
    in_flight = admission.RequestsInFlight() if settings.batch_window > 0 else None
    runtime = Runtime(settings, in_flight)
    rates = DrainRates()
    health = (
        None
        if settings.health_port is None
        else Health(settings.health_port, settings.health_max_stall, HEALTH_PORT_ENV)
    )
    policy = admission.RequestPolicy(
        executor_of=runtime.current_executor,
        router=settings.lane_router(),
        engine_priority=settings.engine_priority,
        retry_after=rates.retry_after,
        served=rates.served,
        max_request_cost=settings.max_request_cost,
        # Readiness follows admission as it changes, not only at the loop's next publish.
        changed=(
            (lambda: None) if health is None else functools.partial(health.admission_changed, runtime.current_executor)
        ),
    )
    admission.install(policy)

    def app_built(args: Any, app: Any) -> None:
        # Bound here, while vLLM builds its app: a port that cannot be had
        # stops the server at start, naming the setting.
        if health is not None:
            health.bind(app_seam.host(args))
        app.add_middleware(TimePhases)

    # Before the door's: its middleware is added outside this one's (`_seams/app.py`).
    app_seam.install(app_built)
    if settings.validation_shortcut:
        validation.install()
    admission.install_door(
        policy,
        refuse=(
            settings.max_queue is not None
            or settings.max_queued_cost is not None
            or settings.max_request_cost is not None
        ),
        in_flight=in_flight,
    )

    def serving_built(serving_object: Any) -> Any:
        admission.cover(type(serving_object))
        if health is not None:
            health.watch(runtime.current_executor, serving_object.engine_client)
        return runtime.postprocess(serving_object)

    from ._seams import renderer as renderer_seam

    if settings.prefix_tokenize:
        renderer_seam.install_prefix_tokenization()

    def make_render(io_processor_object: Any, vllm_config: Any) -> Any:
        if settings.prefix_tokenize:
            # Pricing reads whether prefix tokenization is sound for the served tokenizer.
            renderer_seam.plan_served(io_processor_object.renderer)
        return runtime.render(io_processor_object, vllm_config)

    io_processor.install(make_render)
    serving.install(serving_built)
    serving.install_preprocessing(admission.preprocessed)
    offline.install(runtime.offline_executor)
    _active = settings
    logger.info(
        "offload-vllm: pooling pre/post-processing %s (from %s) on vLLM %s",
        settings.summary(),
        settings.strategy_source,
        version,
    )
