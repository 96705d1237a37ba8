"""The generate routes (`/v1/chat/completions`, `/v1/completions`, `/v1/responses`) answer under a
strategy as vLLM alone does, their text render run by the strategy
(`offload_vllm/_seams/generate.py`).

One tiny random-weight Llama (the session's `model_dirs["generate"]`), greedy.
Servers (`_module_servers`: started with other modules' own): vLLM alone
(`VLLM_PLUGINS=`) and the two strategies whose render is furthest from
vLLM's own call: `process` (the worker process's renderer, its answer pickled
back) and `async-renderer` (vLLM's async render, its tokenization batched
across requests). `inline` and
`thread` run vLLM's synchronous render, on the loop or on a worker thread's
copy of the renderer: that render is compared with vLLM's own in this process
(`OnlineRenderer.render_chat`, `render_completion`), with no server.

The process server admits by a small cost bound (`GENERATE_BOUND`): a flood
of streamed chats is held to it (`test_a_flood_of_streamed_chats_is_held_to_the_bound`),
and the answers compared one at a time are each admitted into an idle bound.

A streamed answer is compared folded into one (`_answers.folded`): vLLM alone merges
the outputs of engine steps its API server has not sent yet into one chunk
(`RequestOutputCollector`), so where a stream's chunks break depends on the
machine's load, not on the render.
"""

from __future__ import annotations

import asyncio
import functools
import json
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from ._answers import events, folded, without_ids
from ._module_servers import ModuleServers, register
from ._server import (
    Server,
    free_port,
    good_retry_after,
    load_client,
    renderer_workers,
    scrape,
    start_server,
    total,
)
from .conftest import AVAILABLE, WORKERS

pytestmark = pytest.mark.timeout(900)

REFERENCE = "vllm"
#: The strategies served here; inline and thread are checked without a server.
SERVED = tuple(s for s in ("process", "async-renderer") if s in AVAILABLE)
IN_PROCESS = tuple(s for s in ("inline", "thread") if s in AVAILABLE)
NAME = "tiny-generate"
#: Small: these servers share the test machine's memory with other modules' servers.
ARGS = ("--runner", "generate", "--max-model-len", "128", "--max-num-seqs", "8")
#: Pool strategies: every call on the executor, none on the loop (the placement test counts each).
OWN_ENV = {s: {"OFFLOAD_VLLM_INLINE_COST": "0"} for s in ("thread", "process")}
#: The process server's cost bound, in characters: two of the flood's chats at once, not three.
GENERATE_BOUND = 600
OWN_ENV["process"]["OFFLOAD_VLLM_MAX_QUEUED_COST"] = str(GENERATE_BOUND)
#: async-renderer's server has the health port and vLLM's own queue bound (engine requests).
ENGINE_BOUND = 2
OWN_ARGS = {"async-renderer": ("--max-num-queued-reqs", str(ENGINE_BOUND))}


@register(__name__, needs=(), servers=1 + len(SERVED))
def starts(model_dirs: Mapping[str, Path], logs: Path) -> dict[str, Callable[[], Server]]:
    model = model_dirs["generate"]
    return {
        REFERENCE: functools.partial(
            start_server, model, NAME, None, logs, extra_env={"VLLM_PLUGINS": ""}, extra_args=ARGS
        ),
        **{
            s: functools.partial(
                start_server, model, NAME, s, logs, workers=WORKERS.get(s), extra_args=(*ARGS, *OWN_ARGS.get(s, ())),
                extra_env=OWN_ENV.get(s, {}) | ({"OFFLOAD_VLLM_HEALTH_PORT": str(free_port())} if s in OWN_ARGS else {}),
            )
            for s in SERVED
        },
    }


@pytest.fixture(scope="module")
def generate_servers(module_servers: ModuleServers) -> Iterator[dict[str, Server]]:
    with module_servers.taken(__name__) as started:
        yield started


GREEDY = {"temperature": 0, "seed": 7, "max_tokens": 12}
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Say something about tokenizers."}]
CHAT = {"messages": MESSAGES, **GREEDY, "return_token_ids": True}
COMPLETION = {"prompt": "Tokenizers split text into", **GREEDY, "return_token_ids": True}
STREAM = {"stream": True, "stream_options": {"include_usage": True}}
CASES = {
    "chat": ("/v1/chat/completions", CHAT),
    "chat-stream": ("/v1/chat/completions", {**CHAT, **STREAM}),
    "chat-text-parts": (
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "Say"}, {"type": "text", "text": " more."}]}]},
    ),
    "completion": ("/v1/completions", COMPLETION),
    "completion-two-prompts": ("/v1/completions", {**COMPLETION, "prompt": ["one two", "three four five"]}),
    "completion-stream": ("/v1/completions", {**COMPLETION, **STREAM}),
}
#: The Responses API (`/v1/responses`), rendered as a chat is: one conversation of input items.
RESPONSES = {"input": "Say something about tokenizers.", "instructions": "be brief", "temperature": 0, "seed": 7,
             "max_output_tokens": 12}
RESPONSES_CASES = {
    "responses": ("/v1/responses", RESPONSES),
    "responses-items": (
        "/v1/responses",
        {**RESPONSES, "input": [{"role": "user", "content": [{"type": "input_text", "text": "Say more."}]}]},
    ),
    "responses-stream": ("/v1/responses", {**RESPONSES, "stream": True}),
}
RESPONSES_BAD = {
    "responses-over-context": ("/v1/responses", {**RESPONSES, "input": "word " * 300}),
    "responses-template-kwargs-clash": ("/v1/responses", {**RESPONSES, "chat_template_kwargs": {"messages": 5}}),
}
BAD = {
    "chat-over-context": ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "word " * 300}]}),
    # vLLM validates this content when its render reads it (a one-shot iterator):
    # under `process` that iterator once failed to pickle, a 400 of other words.
    "chat-part-without-text": ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [{"type": "text"}]}]}),
    # The chat template's own error (jinja's), raised in the render.
    "chat-template-kwargs-clash": ("/v1/chat/completions", {**CHAT, "chat_template_kwargs": {"messages": 5}}),
    "completion-over-context": ("/v1/completions", {**COMPLETION, "prompt": "word " * 300}),
    "completion-token-out-of-vocab": ("/v1/completions", {**COMPLETION, "prompt": [1, 2, 10**7]}),
}


def _answer(server: Server, route: str, body: dict[str, Any]) -> tuple[int, Any]:
    reply = httpx.post(f"{server.url}{route}", json={"model": NAME, **body}, timeout=120)
    if route == "/v1/responses" and reply.status_code == 200:
        # A stream's events each carry what differs between servers; its last holds the whole response.
        response = _response_events(reply.text)[-1]["response"] if body.get("stream") else reply.json()
        return reply.status_code, _without_response_ids(response)
    if body.get("stream") and reply.status_code == 200:
        return reply.status_code, folded(events(reply.text))
    return reply.status_code, without_ids(reply.json())


def _response_events(text: str) -> list[dict[str, Any]]:
    """A streamed Responses answer's events, from its server-sent events (`event:` then `data:`)."""
    return [json.loads(line.removeprefix("data: ")) for line in text.splitlines() if line.startswith("data: ")]


def _without_response_ids(answer: Any) -> Any:
    """A Responses answer but its ids and times (the response's, each output item's)."""
    if isinstance(answer, dict):
        return {k: _without_response_ids(v) for k, v in answer.items() if k not in ("id", "created_at", "request_id")}
    if isinstance(answer, list):
        return [_without_response_ids(v) for v in answer]
    return answer


def test_a_stream_folds_whatever_its_chunks() -> None:
    """Two streams of one answer, one chunk per token and two tokens merged in
    one chunk, fold alike; a different token does not."""
    first = {"id": "a", "created": 1, "model": NAME, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    tokens = [({"content": "to"}, [5]), ({"content": "ken"}, [6]), ({"content": "s"}, [7])]
    one_each = [first] + [
        {"id": "a", "created": 1, "model": NAME, "choices": [{"index": 0, "delta": delta, "token_ids": ids}]}
        for delta, ids in tokens
    ]
    merged = [
        {**first, "id": "b"},
        {"id": "b", "created": 2, "model": NAME, "choices": [{"index": 0, "delta": {"content": "to"}, "token_ids": [5]}]},
        {"id": "b", "created": 2, "model": NAME, "choices": [{"index": 0, "delta": {"content": "kens"}, "token_ids": [6, 7]}]},
    ]
    assert folded(one_each) == folded(merged)
    assert folded(one_each)["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": "tokens"}, "token_ids": [5, 6, 7]}]
    other = [*merged[:2], {**merged[2], "choices": [{"index": 0, "delta": {"content": "kens"}, "token_ids": [6, 8]}]}]
    assert folded(other) != folded(merged)


def served() -> list[Any]:
    return [pytest.param(s, id=s) for s in SERVED]


@pytest.mark.parametrize("case", [*CASES, *RESPONSES_CASES])
@pytest.mark.parametrize("strategy", served())
def test_greedy_answers_are_vllms(generate_servers: dict[str, Server], strategy: str, case: str) -> None:
    route, body = {**CASES, **RESPONSES_CASES}[case]
    expected = _answer(generate_servers[REFERENCE], route, body)
    assert expected[0] == 200, expected
    assert _answer(generate_servers[strategy], route, body) == expected


@pytest.mark.parametrize("case", [*BAD, *RESPONSES_BAD])
@pytest.mark.parametrize("strategy", served())
def test_bad_input_is_answered_as_vllm_does(generate_servers: dict[str, Server], strategy: str, case: str) -> None:
    route, body = {**BAD, **RESPONSES_BAD}[case]
    expected = _answer(generate_servers[REFERENCE], route, body)
    assert expected[0] >= 400, expected
    assert _answer(generate_servers[strategy], route, body) == expected


@pytest.mark.parametrize("strategy", served())
@pytest.mark.parametrize("case", ["chat", "completion", "chat-stream", "responses"])
def test_the_render_runs_on_the_strategy(generate_servers: dict[str, Server], strategy: str, case: str) -> None:
    """Each text request is one call on the strategy's executor (under `process`, in
    one of the server's worker processes; under async-renderer, its micro-batched tokenization)."""
    server = generate_servers[strategy]
    route, body = {**CASES, **RESPONSES_CASES}[case]
    before = total(scrape(server), "offload_run_seconds_count", strategy=strategy)
    assert _answer(server, route, body)[0] == 200
    after = total(scrape(server), "offload_run_seconds_count", strategy=strategy)
    assert after - before == 1
    if strategy == "process":
        assert renderer_workers(server)


def test_vllm_alone_runs_no_strategy(generate_servers: dict[str, Server]) -> None:
    """The reference loads no adapter: no offload metric moves there."""
    server = generate_servers[REFERENCE]
    assert _answer(server, *CASES["chat"])[0] == 200
    assert total(scrape(server), "offload_run_seconds_count") == 0


#: A chat that streams for about a hundred engine steps (`ignore_eos`).
FLOODING_CHAT = {
    "messages": [{"role": "user", "content": "Tell a long story about tokenizers and their vocabularies. " * 2}],
    "max_tokens": 96, "ignore_eos": True, "temperature": 0, **STREAM,
}


#: The same conversation through the Responses API (whose template adds tokens: 80 fit in the model's 128).
FLOODING_RESPONSE = {
    "input": FLOODING_CHAT["messages"][0]["content"], "max_output_tokens": 80, "ignore_eos": True,
    "temperature": 0, "stream": True,
}
FLOODS = {"/v1/chat/completions": FLOODING_CHAT, "/v1/responses": FLOODING_RESPONSE}


@pytest.mark.parametrize("route", list(FLOODS))
def test_a_flood_of_streamed_chats_is_held_to_the_bound(generate_servers: dict[str, Server], route: str) -> None:
    """Chats are admitted as pooling requests are: priced, and holding what
    they cost until their stream's last chunk is sent. 16 streamed chats sent
    at once to a bound that holds two: each is answered 200 whole or refused
    503 with a computed `Retry-After`, some of each; the admitted-requests
    gauge, read meanwhile (and as each answered chat's first chunk comes), is
    never past two, and 0 once they are over; each answered one's phases are
    observed once."""
    from offload_vllm._seams.requests import request_cost
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    server = generate_servers["process"] if "process" in SERVED else pytest.skip("process is not available")
    body = {"model": server.model, **FLOODS[route]}
    request_type = ResponsesRequest if route == "/v1/responses" else ChatCompletionRequest
    cost = request_cost(request_type(**body), len(json.dumps(body)))
    assert 2 * cost <= GENERATE_BOUND < 3 * cost, cost
    readings: list[float] = []

    async def flood() -> list[tuple[int, str | None, str]]:
        done = False
        async with load_client(18, timeout=120) as client:

            async def one() -> tuple[int, str | None, str]:
                async with client.stream("POST", f"{server.url}{route}", json=body) as r:
                    chunks: list[str] = []
                    async for chunk in r.aiter_text():
                        if r.status_code == 200 and not chunks:
                            # Read while this chat streams: its first chunk is sent, its last
                            # is 95 engine steps away, and /metrics is answered on the same loop.
                            values = await asyncio.to_thread(scrape, server)
                            readings.append(total(values, "offload_vllm_admitted_requests"))
                        chunks.append(chunk)
                    return r.status_code, r.headers.get("retry-after"), "".join(chunks)

            async def watch() -> None:
                while not done:
                    values = await asyncio.to_thread(scrape, server)
                    readings.append(total(values, "offload_vllm_admitted_requests"))
                    await asyncio.sleep(0.02)

            watcher = asyncio.create_task(watch())
            try:
                return await asyncio.gather(*(one() for _ in range(16)))
            finally:
                done = True
                await watcher

    def phase_counts() -> dict[str, float]:
        values = scrape(server)
        return {
            phase: total(values, "offload_vllm_request_phase_seconds_count", endpoint=route, phase=phase)
            for phase in ("door", "render", "engine", "response")
        }

    before = phase_counts()
    answers = asyncio.run(flood())
    after = phase_counts()
    statuses = sorted(status for status, _, _ in answers)
    print(f"\n[{route}, bound {GENERATE_BOUND}, cost {cost:g}] {statuses}, admitted gauge max {max(readings)}")  # noqa: T201
    assert set(statuses) == {200, 503}, statuses
    for status, retry_after, text in answers:
        if status == 503:
            assert good_retry_after(retry_after), retry_after
        elif route == "/v1/responses":
            assert _response_events(text)[-1]["response"]["usage"]["output_tokens"] == 80, text[-500:]
        else:
            answer = folded(events(text))
            assert answer["choices"][0]["finish_reason"] == "length", answer
    # Never past the bound. Not asserted: at least one while they stream. One
    # stream of the tiny model lasts 0.4-0.7 s here (held the while: 1 at its
    # 1st, 2nd and 5th chunk when sent alone), and on a loaded machine a
    # scrape was answered only after the streams had ended (all readings 0).
    assert max(readings) <= 2, readings
    assert total(scrape(server), "offload_vllm_admitted_requests") == 0
    # Each answered chat's phases observed once: its render, until its first chunk, its stream.
    assert {phase: after[phase] - before[phase] for phase in after} == dict.fromkeys(after, statuses.count(200))
    assert total(scrape(server), "offload_lane_queued_cost") == 0


def _health(server: Server, path: str) -> int:
    return httpx.get(f"http://127.0.0.1:{server.env['OFFLOAD_VLLM_HEALTH_PORT']}{path}", timeout=10).status_code


def test_a_generate_servers_health_port_and_engine_bound_are_offloads(generate_servers: dict[str, Server]) -> None:
    """On a generate model the loop publishes to the health port (no pooling
    entrypoint is built: the port's task starts with vLLM's app state), and
    vLLM's `--max-num-queued-reqs` is read: 8 streamed chats at once into a
    bound of two engine requests are refused by admission (counted in
    readiness-at-admission's refusals, before any render, each while `/ready`
    said 503), the held engine requests never past two, each answered chat
    streamed whole; 200 again after."""
    if "async-renderer" not in SERVED:
        pytest.skip("async-renderer is not available")
    server = generate_servers["async-renderer"]
    assert (_health(server, "/health"), _health(server, "/ready")) == (200, 200)
    body = {"model": server.model, **FLOODING_CHAT}
    refusals = "offload_vllm_readiness_at_admission_total"
    before = scrape(server)
    refused_before = total(before, refusals, decision="refused")
    refused_ready_before = total(before, refusals, decision="refused", ready="503")
    ready_seen: list[int] = []
    held: list[float] = []

    texts: list[str] = []

    async def flood() -> list[int]:
        async with load_client(10, timeout=120) as client:

            async def one() -> int:
                async with client.stream("POST", f"{server.url}/v1/chat/completions", json=body) as r:
                    chunks: list[str] = []
                    async for chunk in r.aiter_text():
                        if r.status_code == 200 and len(ready_seen) < 8:
                            ready_seen.append(await asyncio.to_thread(_health, server, "/ready"))
                            values = await asyncio.to_thread(scrape, server)
                            held.append(total(values, "offload_vllm_admitted_engine_requests"))
                        chunks.append(chunk)
                    if r.status_code == 200:
                        texts.append("".join(chunks))
                    return r.status_code

            return await asyncio.gather(*(one() for _ in range(8)))

    statuses = sorted(asyncio.run(flood()))
    for text in texts:  # each answered chat streamed whole
        assert folded(events(text))["choices"][0]["finish_reason"] == "length", text[:1000]
    values = scrape(server)
    print(f"\n[engine bound {ENGINE_BOUND}] {statuses}; /ready {ready_seen}, held {held} while streaming")  # noqa: T201
    assert set(statuses) == {200, 503}, statuses
    assert total(values, refusals, decision="refused") - refused_before == statuses.count(503)
    # Readiness said 503 at every refusal (published before each decision).
    assert total(values, refusals, decision="refused", ready="503") - refused_ready_before == statuses.count(503)
    assert max(held) <= ENGINE_BOUND, held
    assert total(values, "offload_vllm_admitted_engine_requests") == 0
    assert (_health(server, "/health"), _health(server, "/ready")) == (200, 200)


# ---- inline and thread: the render in this process ---------------------------


@pytest.fixture(scope="module")
def generate_renderer(model_dirs: dict[str, Path]) -> tuple[Any, Any]:
    """The tiny Llama's `VllmConfig` and the renderer vLLM builds from it."""
    from offload_vllm._seams.renderer import renderer_from_config
    from vllm.engine.arg_utils import EngineArgs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # vLLM's own deprecation/user warnings at config time
        config = EngineArgs(
            model=str(model_dirs["generate"]), runner="generate", dtype="float32", max_model_len=128
        ).create_engine_config()
    return config, renderer_from_config(config)


def _rendered(online: Any, route: str, body: dict[str, Any]) -> Any:
    """`OnlineRenderer`'s render of a request, as a route has it (arrival times
    left out), or the error it raised."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    with warnings.catch_warnings():
        # vLLM's own: its chat render warns that `max_tokens` is deprecated.
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            if route == "/v1/chat/completions":
                request = ChatCompletionRequest.model_validate({"model": NAME, **body})
                result = asyncio.run(online.render_chat(request))
            else:
                request = CompletionRequest.model_validate({"model": NAME, **body})
                result = asyncio.run(online.render_completion(request))
        except Exception as error:  # compared, type and words, with vLLM's own
            return {"error": type(error), "message": str(error)}
    conversation, inputs = result if isinstance(result, tuple) else (None, result)
    engine_inputs = [{k: v for k, v in engine_input.items() if k != "arrival_time"} for engine_input in inputs]
    return {"conversation": conversation, "engine_inputs": engine_inputs}


def _renders(strategy: str) -> tuple[float, float]:
    """Renders run so far in this process: on the loop (a cheap call), on `strategy`'s executor."""
    import prometheus_client
    from offload_vllm._loop_calls import LOOP_CALLS

    on_loop = prometheus_client.REGISTRY.get_sample_value(f"{LOOP_CALLS}_total", {"call": "render"}) or 0.0
    return on_loop, sum(
        sample.value
        for family in prometheus_client.REGISTRY.collect()
        for sample in family.samples
        if sample.name == "offload_run_seconds_count" and sample.labels.get("strategy") == strategy
    )


@pytest.mark.parametrize("strategy", IN_PROCESS)
def test_the_render_on_the_loop_or_a_thread_is_vllms(generate_renderer: tuple[Any, Any], strategy: str) -> None:
    """Every case, good and bad, renders under the strategy's placement as vLLM's
    own async render does: the same conversation and engine inputs, or the same error."""
    from offload_vllm import read_settings
    from offload_vllm._runtime import Runtime
    from offload_vllm._seams.generate import StrategyRenderer
    from vllm.renderers.online_renderer import OnlineRenderer

    config, renderer = generate_renderer
    env = {"OFFLOAD_VLLM_STRATEGY": strategy}
    if strategy == "thread":
        env |= {"OFFLOAD_VLLM_WORKERS": str(WORKERS["thread"]), **OWN_ENV["thread"]}
    placement = Runtime(read_settings(env)).placement(config)

    def online(served: Any) -> Any:
        return OnlineRenderer(
            config.model_config, served, request_logger=None, chat_template=None, chat_template_content_format="auto"
        )

    alone, offloaded = online(renderer), online(StrategyRenderer(renderer, placement.render_generate(renderer)))
    cases = {**CASES, **BAD}
    try:
        loop_before, executor_before = _renders(strategy)
        for name, (route, body) in cases.items():
            expected = _rendered(alone, route, body)
            # The token out of vocabulary renders; the engine's input check refuses it.
            assert ("error" in expected) is (name in BAD and name != "completion-token-out-of-vocab"), expected
            assert _rendered(offloaded, route, body) == expected, name
        on_loop, on_executor = _renders(strategy)
        # chat-part-without-text's content fails its validation as it is read, before the render.
        rendered = len(cases) - 1
        assert (on_loop - loop_before) + (on_executor - executor_before) == rendered
        if strategy == "thread":  # every call on a worker thread (OFFLOAD_VLLM_INLINE_COST=0)
            assert on_executor - executor_before == rendered
    finally:
        placement.executor.shutdown()


def test_a_chats_template_arguments_are_priced_with_its_messages(generate_renderer: tuple[Any, Any]) -> None:
    """A short chat renders on the loop under a cheap-call threshold; the same
    chat with a long tool description (rendered by the template) is priced
    past it and runs on a worker thread."""
    from offload_vllm import read_settings
    from offload_vllm._runtime import Runtime
    from offload_vllm._seams.generate import StrategyRenderer
    from vllm.renderers.online_renderer import OnlineRenderer

    config, renderer = generate_renderer
    env = {"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_WORKERS": "1", "OFFLOAD_VLLM_INLINE_COST": "2000"}
    placement = Runtime(read_settings(env)).placement(config)
    online = OnlineRenderer(
        config.model_config, StrategyRenderer(renderer, placement.render_generate(renderer)),
        request_logger=None, chat_template=None, chat_template_content_format="auto",
    )
    def render_chat(online: Any, body: dict[str, Any]) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            asyncio.run(online.render_chat(ChatCompletionRequest.model_validate({"model": NAME, **body})))

    tool = {"type": "function", "function": {"name": "f", "description": "d" * 20_000, "parameters": {}}}
    short = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    try:
        before = _renders("thread")
        render_chat(online, short)
        after_short = _renders("thread")
        render_chat(online, {**short, "tools": [tool], "tool_choice": "none"})  # "auto" needs a tool parser
        after_tools = _renders("thread")
    finally:
        placement.executor.shutdown()
    assert (after_short[0] - before[0], after_short[1] - before[1]) == (1, 0)  # on the loop
    assert (after_tools[0] - after_short[0], after_tools[1] - after_short[1]) == (0, 1)  # on a worker
