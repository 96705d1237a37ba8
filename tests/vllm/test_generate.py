"""The generate routes (`/v1/chat/completions`, `/v1/completions`) under every
strategy answer as vLLM alone does, their text render run by the strategy
(`offload_vllm/_seams/generate.py`).

One tiny random-weight Llama (`benchmarks.harness.models.build_tiny_generate_model`),
greedy: one reference server (`VLLM_PLUGINS=`, no adapter) and one per strategy,
started for this module only."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ._server import Server, renderer_workers, scrape, servers_started, start_server, total
from .conftest import AVAILABLE, WORKERS

#: Five servers start together on a small machine (about 6 minutes on 2 cores).
pytestmark = pytest.mark.timeout(1200)

GENERATE_STRATEGIES = tuple(s for s in AVAILABLE if s != "ray")
REFERENCE = "vllm"
NAME = "tiny-generate"
#: Small: the whole module's servers share the test machine's memory.
ARGS = ("--runner", "generate", "--max-model-len", "128", "--max-num-seqs", "8")


@pytest.fixture(scope="module")
def generate_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    from benchmarks.harness.models import build_tiny_generate_model

    model = build_tiny_generate_model(tmp_path_factory.mktemp("models") / "tiny-llama-generate")
    logs = tmp_path_factory.mktemp("generate-logs")
    starts: dict[str, Any] = {
        REFERENCE: lambda: start_server(model, NAME, None, logs, extra_env={"VLLM_PLUGINS": ""}, extra_args=ARGS)
    }
    for strategy in GENERATE_STRATEGIES:
        starts[strategy] = lambda s=strategy: start_server(
            model, NAME, s, logs, workers=WORKERS.get(s), extra_args=ARGS, extra_env=OWN_ENV.get(s)
        )
    with servers_started(starts) as started:
        yield started


def strategies() -> list[Any]:
    return [pytest.param(s, id=s) for s in GENERATE_STRATEGIES]


#: Pool strategies: every call on the executor, none on the loop (the test of placement counts each).
OWN_ENV = {s: {"OFFLOAD_VLLM_INLINE_COST": "0"} for s in ("thread", "process")}

GREEDY = {"temperature": 0, "seed": 7, "max_tokens": 12}
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Say something about tokenizers."}]


def _answer(server: Server, route: str, body: dict[str, Any]) -> tuple[int, Any]:
    reply = httpx.post(f"{server.url}{route}", json={"model": NAME, **body}, timeout=120)
    if body.get("stream") and reply.status_code == 200:
        return reply.status_code, _streamed(reply.text)
    return reply.status_code, _without_ids(reply.json())


def _without_ids(answer: Any) -> Any:
    """The answer but what differs between any two servers (its id, its time)."""
    if isinstance(answer, dict):
        return {k: _without_ids(v) for k, v in answer.items() if k not in ("id", "created")}
    if isinstance(answer, list):
        return [_without_ids(v) for v in answer]
    return answer


def _streamed(text: str) -> list[Any]:
    events = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [_without_ids(json.loads(event)) for event in events[:-1]]


CHAT = {"messages": MESSAGES, **GREEDY, "return_token_ids": True}
COMPLETION = {"prompt": "Tokenizers split text into", **GREEDY, "return_token_ids": True}
CASES = {
    "chat": ("/v1/chat/completions", CHAT),
    "chat-stream": ("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"include_usage": True}}),
    "completion": ("/v1/completions", COMPLETION),
    "completion-two-prompts": ("/v1/completions", {**COMPLETION, "prompt": ["one two", "three four five"]}),
    "completion-stream": ("/v1/completions", {**COMPLETION, "stream": True, "stream_options": {"include_usage": True}}),
}
BAD = {
    "chat-over-context": ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "word " * 300}]}),
    "completion-over-context": ("/v1/completions", {**COMPLETION, "prompt": "word " * 300}),
    "completion-token-out-of-vocab": ("/v1/completions", {**COMPLETION, "prompt": [1, 2, 10**7]}),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("strategy", strategies())
def test_greedy_answers_are_vllms(generate_servers: dict[str, Server], strategy: str, case: str) -> None:
    route, body = CASES[case]
    expected = _answer(generate_servers[REFERENCE], route, body)
    assert expected[0] == 200, expected
    assert _answer(generate_servers[strategy], route, body) == expected


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("strategy", strategies())
def test_bad_input_is_answered_as_vllm_does(generate_servers: dict[str, Server], strategy: str, case: str) -> None:
    route, body = BAD[case]
    expected = _answer(generate_servers[REFERENCE], route, body)
    assert expected[0] >= 400, expected
    assert _answer(generate_servers[strategy], route, body) == expected


@pytest.mark.parametrize("strategy", strategies())
@pytest.mark.parametrize("case", ["chat", "completion", "chat-stream"])
def test_the_render_runs_on_the_strategy(generate_servers: dict[str, Server], strategy: str, case: str) -> None:
    """Each text request is one call on the strategy's executor (under `process`, in
    one of the server's worker processes; under async-renderer, its micro-batched tokenization)."""
    server = generate_servers[strategy]
    route, body = CASES[case]
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
