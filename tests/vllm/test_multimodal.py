"""Chat requests with images answer under a strategy as vLLM alone does, their
multimodal processing (the model's processor, Hugging Face's inside it) run
by the strategy (`offload_vllm/_seams/multimodal.py`).

One tiny random-weight Idefics3 (`benchmarks/harness/mm_models.py`), greedy.
Servers (`_module_servers`: started with other modules' own): vLLM alone
(`VLLM_PLUGINS=`, its processor cache at vLLM's default), and `thread` and
`process` with two workers each and the cache off (`--mm-processor-cache-gb 0`:
with it on, the adapter refuses to start, tested here too).

A streamed answer is compared folded into one (`_answers.folded`): where a stream's
chunks break depends on the machine's load, not on the render.
"""

from __future__ import annotations

import base64
import functools
import io
import json
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from PIL import Image

from benchmarks.harness.mm_models import TINY_IDEFICS3_NAME, build_tiny_multimodal_model

from ._answers import events, folded, without_ids
from ._module_servers import ModuleServers, register
from ._server import Server, renderer_workers, scrape, start_server
from .conftest import AVAILABLE, WORKERS

pytestmark = pytest.mark.timeout(900)

REFERENCE = "vllm"
SERVED = tuple(s for s in ("thread", "process") if s in AVAILABLE)
NAME = "tiny-idefics3"
#: The most images one prompt may carry (`--limit-mm-per-prompt`).
MAX_IMAGES = 2
ARGS = (
    "--runner", "generate", "--max-model-len", "512", "--max-num-seqs", "8",
    "--limit-mm-per-prompt", json.dumps({"image": MAX_IMAGES}),
)
#: Several renderers cannot share vLLM's processor cache (decision 0030).
NO_CACHE = ("--mm-processor-cache-gb", "0")
#: Every call on the executor, none on the loop (the placement test counts them).
OWN_ENV = {"OFFLOAD_VLLM_INLINE_COST": "0"}


def _model(model_dirs: Mapping[str, Path]) -> Path:
    # Built beside the session's other models (`model_dirs` holds their root's children).
    root = next(iter(p for k, p in model_dirs.items() if k != "embed")).parent
    return build_tiny_multimodal_model(root / TINY_IDEFICS3_NAME)


@register(__name__, needs=SERVED, servers=1 + len(SERVED))
def starts(model_dirs: Mapping[str, Path], logs: Path) -> dict[str, Callable[[], Server]]:
    model = _model(model_dirs)
    return {
        REFERENCE: functools.partial(
            start_server, model, NAME, None, logs, extra_env={"VLLM_PLUGINS": ""}, extra_args=ARGS
        ),
        **{
            s: functools.partial(
                start_server, model, NAME, s, logs, workers=WORKERS[s], extra_args=(*ARGS, *NO_CACHE),
                extra_env=OWN_ENV,
            )
            for s in SERVED
        },
    }


@pytest.fixture(scope="module")
def mm_servers(module_servers: ModuleServers) -> Iterator[dict[str, Server]]:
    with module_servers.taken(__name__) as started:
        yield started


def data_url(width: int, height: int, color: tuple[int, int, int]) -> str:
    """A PNG of one colour, with a darker diagonal (so resizing has detail to keep), as a data URL."""
    image = Image.new("RGB", (width, height), color)
    for i in range(min(width, height)):
        image.putpixel((i, i), (color[0] // 2, color[1] // 2, color[2] // 2))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


GREEDY = {"temperature": 0, "seed": 7, "max_tokens": 8, "return_token_ids": True, "logprobs": True}
RED = data_url(100, 80, (200, 30, 30))
BLUE = data_url(300, 40, (20, 40, 220))
ONE_IMAGE = [{"role": "user", "content": [image_part(RED), text_part("what is this?")]}]
MIXED = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": [text_part("compare"), image_part(RED), text_part("and"), image_part(BLUE)]},
    {"role": "assistant", "content": "two colours"},
    {"role": "user", "content": "which is wider?"},
]
STREAM = {"stream": True, "stream_options": {"include_usage": True}}
CASES = {
    "one-image": ONE_IMAGE,
    "mixed-text-and-images": MIXED,
}
BAD = {
    "broken-base64": [{"role": "user", "content": [image_part("data:image/png;base64,iVBORw0KGgo!!!not-base64"), text_part("x")]}],
    "not-an-image": [{"role": "user", "content": [image_part("data:image/png;base64," + base64.b64encode(b"plain text").decode())]}],
    "bad-data-url": [{"role": "user", "content": [image_part("data:image/png,no-base64-marker")]}],
    "too-many-images": [{"role": "user", "content": [image_part(RED)] * (MAX_IMAGES + 1)}],
}


def _answer(server: Server, messages: list[dict[str, Any]], extra: Mapping[str, Any] = {}) -> tuple[int, Any]:
    body = {"model": NAME, "messages": messages, **GREEDY, **extra}
    reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    if body.get("stream") and reply.status_code == 200:
        return reply.status_code, folded(events(reply.text))
    return reply.status_code, without_ids(reply.json())


@pytest.mark.parametrize("strategy", SERVED)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_an_image_chat_answers_as_vllm_alone(
    mm_servers: dict[str, Server], strategy: str, stream: bool, case: str
) -> None:
    """Greedy: the same prompt and answer token ids, logprobs, text, usage and
    finish reason as vLLM alone's; the prompt's images processed in one call
    on the strategy's executor."""
    extra = STREAM if stream else {}
    reference = _answer(mm_servers[REFERENCE], CASES[case], extra)
    assert reference[0] == 200, reference
    answer = reference[1]
    assert answer["usage"]["prompt_tokens"] > 20, answer["usage"]  # the images' tokens are in the prompt
    assert answer["choices"][0]["finish_reason"] in ("length", "stop")
    server = mm_servers[strategy]
    runs = _executor_runs(server, strategy)
    assert _answer(server, CASES[case], extra) == reference
    assert _executor_runs(server, strategy) - runs == 1


@pytest.mark.parametrize("strategy", SERVED)
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_image_input_is_refused_as_vllm_alone_refuses_it(
    mm_servers: dict[str, Server], strategy: str, case: str
) -> None:
    reference = _answer(mm_servers[REFERENCE], BAD[case])
    # A data URL without base64 is 501 (vLLM: "Only base64 data URLs are supported").
    assert reference[0] >= 400, reference
    assert _answer(mm_servers[strategy], BAD[case]) == reference


def _executor_runs(server: Server, strategy: str) -> float:
    return sum(
        value
        for (name, labels), value in scrape(server).items()
        if name == "offload_run_seconds_count" and dict(labels).get("strategy") == strategy
    )


def _cpu_seconds(processes: list[psutil.Process]) -> float:
    return sum(sum(p.cpu_times()[:2]) for p in processes)


def test_under_process_the_processor_runs_in_the_worker_processes(mm_servers: dict[str, Server]) -> None:
    """Each request with images is one call on the executor, and the CPU time it
    takes (large images, resized by the Hugging Face processor) is spent in the
    worker processes."""
    if "process" not in mm_servers:
        pytest.skip("no process server here")
    server = mm_servers["process"]
    workers = renderer_workers(server)
    # The pool's workers and the express worker.
    assert len(workers) > WORKERS["process"], [p.pid for p in workers]
    big = [
        [{"role": "user", "content": [image_part(data_url(2048, 2048, (10 * i, 90, 160))), text_part("hi")]}]
        for i in range(4)
    ]
    runs, cpu = _executor_runs(server, "process"), _cpu_seconds(workers)
    for messages in big:
        status, answer = _answer(server, messages)
        assert status == 200, answer
    assert _executor_runs(server, "process") - runs == len(big)
    spent = _cpu_seconds(workers) - cpu
    # Resizing four 2048 x 2048 images took over 0.2 s of CPU in a worker on this machine.
    assert spent > 0.1, spent


@pytest.mark.parametrize("senders", [1, 2])
def test_vllms_processor_cache_pairs_one_sender_with_the_engines_receiver(
    model_dirs: dict[str, Path], senders: int
) -> None:
    """The premise of the start-up refusal below, on vLLM's own caches: a
    renderer's sender cache keeps a shadow of the engine's receiver cache and
    sends no data for an item its shadow holds. One sender sees every item and
    stays in step; two, each seeing some, drift: one sends nothing for an item
    the receiver evicted (vLLM's `MultiModalCacheMissError`, a failed request)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.multimodal.cache.base import MultiModalCacheMissError
    from vllm.multimodal.cache.lru import LruKeyReplicatedReceiverCache, LruKeyReplicatedSenderCache
    from vllm.multimodal.inputs import MultiModalKwargsItem

    mib = 1 << 20
    # Room for two items of 1 MiB.
    config = EngineArgs(model=str(_model(model_dirs)), mm_processor_cache_gb=2.5 * mib / (1 << 30)).create_model_config()
    renderers = [LruKeyReplicatedSenderCache(config) for _ in range(senders)]
    engine = LruKeyReplicatedReceiverCache(config)
    items = {key: MultiModalKwargsItem.dummy(mib) for key in "abc"}
    missed = []
    # a and c to the first renderer, b to the last: the engine sees a, b, c and evicts a.
    for key, renderer in (("a", 0), ("b", -1), ("c", 0), ("a", 0)):
        sent, _ = renderers[renderer].get_and_update_item((items[key], []), key)
        try:
            engine.get_and_update_item(sent, key)
        except MultiModalCacheMissError:
            missed.append(key)
    assert missed == ([] if senders == 1 else ["a"])


@pytest.mark.parametrize("strategy", SERVED)
def test_several_workers_with_the_processor_cache_on_refuse_to_start(
    tmp_path: Path, model_dirs: dict[str, Path], strategy: str
) -> None:
    """vLLM's processor cache pairs one sender with the engine's receiver:
    with two renderers the server stops at start, naming the setting."""
    model = _model(model_dirs)
    server = start_server(model, NAME, strategy, tmp_path, workers=2, extra_args=ARGS, extra_env=OWN_ENV)
    try:
        deadline = time.monotonic() + 300
        while server.alive() and time.monotonic() < deadline:
            time.sleep(1)
        assert not server.alive(), "the server started"
    finally:
        if server.alive():
            os.killpg(server.proc.pid, signal.SIGKILL)
        server.stop()
    assert "--mm-processor-cache-gb 0" in server.log.read_text(errors="replace"), server.log_tail()
