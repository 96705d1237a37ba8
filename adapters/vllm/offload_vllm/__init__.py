"""offload-vllm: choose how vLLM's pooling entrypoints run pre- and post-processing.

Installed next to vLLM, this package registers `register` in vLLM's
`vllm.general_plugins` entry-point group, which vLLM calls in every process it
starts. `OFFLOAD_VLLM_STRATEGY` (else `OFFLOAD_STRATEGY`) picks the strategy;
unset, vLLM keeps its own behaviour, and the health port
(`OFFLOAD_VLLM_HEALTH_PORT`) alone may be served beside it. The settings' old
names, `VLLM_OFFLOAD_*`, still work, with a warning. See docs/vllm.md.

The path of one request, and the module that holds each step (the same
diagram is in docs/vllm.md#the-path-of-a-request)::

    client ──HTTP POST /v1/embeddings, /score, ...──▶ vLLM's app
      │  vLLM's middleware (CORS, --api-key, --middleware): offload is inside it
      ▼
    door middleware    _admission.py       RefuseWhenFull: 503 / 413 / 400 before the body
                                           is read; HoldUntilAnswered, CountRequests (added
                                           by _seams/app.py)
      ▼                                    FastAPI validates the body (_seams/validation.py)
    admission          _admission.py       the same rule at the serving object's __call__
                                           (_seams/serving.py): cost (_cost.py via
                                           _seams/requests.py), lane (_lanes.py), engine
                                           priority, held until the answer is sent;
                                           answers in vLLM's words (_seams/errors.py)
      ▼
    placement          _placements/        one per strategy kind (_kinds.py): on the loop,
                                           in-thread, remote, batched; built by _runtime.py
      ▼
    executor           offload.Executor    the strategy's workers (_workers.py in a remote one)
      ▼
    seam               _seams/io_processor.py, renderer.py, serving.py: vLLM's own render
                                           and post-processing code, run by the placement;
                                           generate.py: the generate routes' admission and text render;
                                           multimodal.py: images' processing, any route
      ▼
    engine             vLLM's engine (untouched; the request's priority set at admission)
      ▼
    response           post-processing: _seams/serving.py → placement → executor → the body

Settings: one table, `_options.py` (parsed by `_parsers.py`, read into
`Settings` by `_config.py`); `register` below wires the rest. Admission
has one home, `_admission.py`: the rule (one for the door and the serving
seam), the reads of the executor's counts, and the listeners readiness
(`_health.py`), `Retry-After` (`_retry_after.py`) and phases subscribe. Every touch
of vLLM's internals is in `_seams/`, each vLLM function patched from one
module there; nothing outside `_seams/` imports vLLM. Beside the path:
`_seams/multimodal.py`, the multimodal processing of a request's images on
every route (chat and completions included), placed as rendering is;
`_prefix/`, prefix tokenization of truncated texts and pairs (run by
`_seams/renderer.py` and `_seams/scoring.py`, priced by `_cost.py`);
`_seamcheck.py`, the seams looked for in vLLM's source (`_vllm_source.py`
reads it); `_health.py`, the health port (and what readiness answered at
each admission decision, a metric); `_phases.py` and `_loop_calls.py`, the
adapter's other metrics (made once per process, `_metric_family.py`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ._config import ADAPTER_STRATEGIES as ADAPTER_STRATEGIES
from ._config import HEALTH_PORT_ENV
from ._config import OffloadVLLMConfigError as OffloadVLLMConfigError
from ._config import Settings as Settings
from ._config import adopt_new_names as _adopt_new_names
from ._config import read_settings as read_settings
from ._process_role import is_worker_process
from ._seams import TESTED_VLLM_VERSIONS as TESTED_VLLM_VERSIONS
from ._seams import UnsupportedVLLMVersion as UnsupportedVLLMVersion

if TYPE_CHECKING:
    from ._admission import EngineRequests, RequestPolicy, RequestsInFlight
    from ._health import Health
    from ._retry_after import DrainRates
    from ._seams.app import AppHook

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
        UnsupportedVLLMVersion: a strategy or the health port is set and this vLLM lacks a seam.
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
        if settings.health_port is not None:
            from ._seamcheck import require_supported_vllm

            version = require_supported_vllm()
            _serve_health_alone(settings.health_port, settings.health_max_stall)
            logger.info("offload-vllm: no strategy set, vLLM keeps its own behaviour; %s on vLLM %s", settings.summary(), version)
        else:
            logger.debug("offload-vllm: no strategy set; vLLM keeps its own behaviour")
        _active = settings
        return

    from ._seamcheck import require_supported_vllm

    version = require_supported_vllm()
    from ._admission import EngineRequests, RequestPolicy, RequestsInFlight, report
    from ._phases import LISTENER as PHASES_LISTENER
    from ._retry_after import DrainRates
    from ._runtime import Runtime, server_share
    from ._seams import app_state, generate, io_processor, multimodal, offline, responses, serving
    from ._seams import config as config_seam
    from ._seams import engine as engine_seam
    from ._seams.errors import ANSWERS

    # async-renderer's window is spent only while other requests are in flight.
    in_flight = RequestsInFlight() if settings.batch_window > 0 else None
    runtime = Runtime(settings, in_flight)
    rates = DrainRates()
    engine = EngineRequests()
    report(engine)
    policy = RequestPolicy(
        executor_of=runtime.current_executor,
        router=settings.lane_router(),
        engine_priority=settings.engine_priority,
        retry_after=rates.retry_after,
        answers=ANSWERS,
        max_request_cost=settings.max_request_cost,
        engine=engine,
    )
    health = _health_of(settings, rates, engine)
    for listener in (rates, PHASES_LISTENER, health):
        if listener is not None:
            policy.subscribe(listener)
    serving.install_admission(policy)
    generate.install_admission(policy)
    _install_app_hooks(settings, policy, in_flight, health)

    def engine_client_built(engine_client: Any) -> None:
        # vLLM's bound is the server's: this API server process admits within its share.
        index, count = config_seam.api_server_of(engine_client.vllm_config)
        engine.limit = server_share(engine_seam.max_num_queued_reqs(engine_client), index, count)
        if health is not None:
            health.watch(runtime.current_executor, engine_client)

    def serving_built(serving_object: Any) -> Any:
        serving.cover(type(serving_object))
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
    generate.install(runtime.render_generate)
    multimodal.install(runtime.process_multimodal)
    responses.install_response_encoder()
    app_state.install(engine_client_built)
    serving.install(serving_built)
    serving.install_preprocessing()
    offline.install(runtime.offline_executor)
    _active = settings
    # Every process vLLM starts loads the plugin: the API server's start-up
    # summary is logged once its workers are started (`Runtime`).
    logger.debug(
        "offload-vllm: pooling pre/post-processing %s (from %s) on vLLM %s",
        settings.summary(),
        settings.strategy_source,
        version,
    )


def _health_of(settings: Settings, rates: DrainRates, engine: EngineRequests) -> Health | None:
    """The health port's endpoints (`None` without `OFFLOAD_VLLM_HEALTH_PORT`),
    readiness judged at the typical cost and engine requests `rates` measure."""
    if settings.health_port is None:
        return None
    from ._admission import Readiness
    from ._health import Health

    readiness = Readiness(rates.typical_cost, engine, rates.typical_engine_requests)
    return Health(settings.health_port, settings.health_max_stall, HEALTH_PORT_ENV, readiness)


def _install_app_hooks(
    settings: Settings, policy: RequestPolicy, in_flight: RequestsInFlight | None, health: Health | None
) -> None:
    """What runs as vLLM builds its app, in this order, before vLLM adds its own
    middleware (CORS, `--api-key`, `--middleware`): so each middleware added
    here sits inside vLLM's and the operator's (a request they refuse gets
    nothing from offload), and, the last added being the outermost, inside
    the ones added after it: TimePhases, RefuseWhenFull, HoldUntilAnswered,
    CountRequests."""
    from ._admission import CountRequests, HoldUntilAnswered, RefuseWhenFull
    from ._phases import TimePhases
    from ._seams import app as app_seam
    from ._seams import validation

    hooks: list[app_seam.AppHook] = []
    if in_flight is not None:

        def count_requests(args: Any, app: Any) -> None:
            app.add_middleware(CountRequests, count=in_flight)

        hooks.append(count_requests)

    def hold_until_answered(args: Any, app: Any) -> None:
        app.add_middleware(HoldUntilAnswered)

    hooks.append(hold_until_answered)

    # Always: vLLM's --max-num-queued-reqs (`EngineRequests`) is read only once the engine is built.
    def refuse_when_full(args: Any, app: Any) -> None:
        app.add_middleware(RefuseWhenFull, policy=policy)

    hooks.append(refuse_when_full)
    if settings.validation_shortcut:
        hooks.append(validation.shortcut_validation)
    if health is not None:
        hooks.append(_binds(health))

    def time_phases(args: Any, app: Any) -> None:
        app.add_middleware(TimePhases)

    app_seam.install(*hooks, time_phases)


def _binds(health: Health) -> AppHook:
    """The app hook that binds `health`'s port on vLLM's `--host` as vLLM builds its app."""
    from ._seams import app as app_seam
    from ._seams import serve_command

    def bind_health(args: Any, app: Any) -> None:
        # A port that cannot be had, or that each of several API server
        # processes would bind, stops the server at start, naming the setting.
        health.bind(app_seam.host(args), serve_command.api_server_count(args))

    return bind_health


def _serve_health_alone(port: int, max_stall: float) -> None:
    """No strategy, the health port set: the port, bound as vLLM builds its app,
    and the loop's task, started when the first pooling entrypoint is built,
    as with a strategy; nothing else of vLLM is changed (its pooling serving
    objects are seen as they are built, not altered). Readiness then follows
    liveness and shutdown alone: there is no admission to refuse."""
    from ._health import Health
    from ._seams import app as app_seam
    from ._seams import app_state

    health = Health(port, max_stall, HEALTH_PORT_ENV)
    app_seam.install(_binds(health))
    app_state.install(lambda engine_client: health.watch(lambda: None, engine_client))
