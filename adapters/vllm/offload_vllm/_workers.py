"""What runs inside an offload worker: module-level functions, so `process` and `ray` can pickle them.

Thread workers keep, per worker, a copy of each IO processor bound to a renderer
with the worker's own tokenizer. Remote workers (processes, Ray actors) build
their own renderer from the served model's `VllmConfig` (sent once, as the
initializer's argument) and their own IO processors and serving shells from
picklable specs, so only request parameters, engine inputs and engine outputs
cross the process boundary.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import offload

from ._process_role import mark_worker_process
from ._seams import config as config_seam
from ._seams import generate as generate_seam
from ._seams import multimodal as multimodal_seam
from ._seams import renderer as renderer_seam
from ._seams import responses as responses_seam
from ._seams import serving as serving_seam


def render_each(fn: Callable[..., Any], lead: tuple[Any, ...], render_params: Sequence[Any]) -> list[Any]:
    """Several of one request's prompts in one call, `fn(*lead, params)` each:
    one hand-off (one message each way, for a remote worker) instead of one each."""
    return [fn(*lead, params) for params in render_params]


# ---- in-thread ---------------------------------------------------------------


@dataclass
class ThreadWorker:
    """One worker thread's renderers: a tokenizer of its own per served renderer."""

    clones: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    renderers: dict[int, tuple[Any, Any]] = field(default_factory=dict)

    def renderer(self, shared: Any) -> Any:
        entry = self.renderers.get(id(shared))
        if entry is None or entry[0] is not shared:
            entry = self.renderers[id(shared)] = (shared, renderer_seam.with_own_tokenizer(shared))
        return entry[1]

    #: Per served renderer, a copy with this thread's own multimodal processor.
    multimodal: dict[int, tuple[Any, Any]] = field(default_factory=dict)

    def multimodal_renderer(self, shared: Any) -> Any:
        entry = self.multimodal.get(id(shared))
        if entry is None or entry[0] is not shared:
            entry = self.multimodal[id(shared)] = (shared, multimodal_seam.with_own_processor(shared))
        return entry[1]

    def io_processor(self, shared: Any) -> Any:
        entry = self.clones.get(id(shared))
        if entry is None or entry[0] is not shared:
            own = renderer_seam.with_own_tokenizer(shared.renderer)
            entry = self.clones[id(shared)] = (shared, renderer_seam.rebind_io_processor(shared, own))
        return entry[1]


def init_thread_worker() -> ThreadWorker:
    return ThreadWorker()


def render_in_thread(io_processor: Any, render_params: Any) -> Any:
    worker: ThreadWorker = offload.worker_state()
    return worker.io_processor(io_processor).render(render_params)


def render_generate_in_thread(renderer: Any, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    worker: ThreadWorker = offload.worker_state()
    return generate_seam.render(worker.renderer(renderer), method, args, kwargs)


def process_multimodal_in_thread(renderer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    worker: ThreadWorker = offload.worker_state()
    return multimodal_seam.process_in_thread(renderer, worker.multimodal_renderer(renderer), args, kwargs)


# ---- remote ------------------------------------------------------------------


@dataclass(frozen=True)
class IOProcessorSpec:
    """How a remote worker rebuilds an IO processor: its class and chat-template config."""

    cls: type
    chat_template_config: Any

    def key(self) -> tuple[type, str]:
        # ChatTemplateConfig is an unhashable dataclass; its repr names every field.
        return (self.cls, repr(self.chat_template_config))


@dataclass(frozen=True)
class ServingSpec:
    """A serving object without its live parts, pickled once in the server (`blob`) and
    unpickled once per worker (`key`)."""

    key: str
    blob: bytes


@dataclass
class RemoteWorker:
    """One remote worker's renderer, and the IO processors and serving shells built on it."""

    vllm_config: Any
    renderer: Any
    io_processors: dict[tuple[type, str], Any] = field(default_factory=dict)
    servings: dict[str, Any] = field(default_factory=dict)

    def io_processor(self, spec: IOProcessorSpec) -> Any:
        io = self.io_processors.get(spec.key())
        if io is None:
            io = self.io_processors[spec.key()] = spec.cls(
                vllm_config=self.vllm_config,
                renderer=self.renderer,
                chat_template_config=spec.chat_template_config,
            )
        return io

    def serving(self, spec: ServingSpec, io_processor: Any) -> Any:
        shell = self.servings.get(spec.key)
        if shell is None:
            cls, attributes = pickle.loads(spec.blob)
            shell = self.servings[spec.key] = serving_seam.rebuild_shell(
                cls, attributes, self.renderer, io_processor
            )
        return shell


#: The title `process` workers show in `ps` (and how tests find them).
PROCESS_TITLE = "offload-vllm::renderer"


def init_remote_worker(vllm_config: Any, retitle: bool, prefix_tokenize: bool = True) -> RemoteWorker:
    """A remote worker's initializer: marks the process (`_process_role`) before
    vLLM runs here, then builds its renderer. `retitle`: show `PROCESS_TITLE`
    in `ps` (`process`; a Ray actor keeps Ray's title, which Ray's tools show).
    `prefix_tokenize`: its renderers tokenize truncated prompts by prefix, as the
    server's do (`_prefix/`); the plugin patches nothing in a worker process.
    Its scoring answers are encoded as the server's are (`_seams/responses.py`)."""
    mark_worker_process()
    if prefix_tokenize:
        renderer_seam.install_prefix_tokenization()
    responses_seam.install_response_encoder()
    if retitle:
        import setproctitle  # a vLLM dependency

        setproctitle.setproctitle(f"{PROCESS_TITLE} {config_seam.served_model_name(vllm_config)}")
    renderer = renderer_seam.renderer_from_config(vllm_config)
    multimodal_seam.count_requests_apart(renderer)
    return RemoteWorker(vllm_config, renderer)


def render_in_process(spec: IOProcessorSpec, render_params: Any) -> Any:
    worker: RemoteWorker = offload.worker_state()
    return worker.io_processor(spec).render(render_params)


def render_generate_in_process(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A generate route's text render with the worker's renderer: `EngineInput` dicts (and, for
    chat, the conversations) go back."""
    worker: RemoteWorker = offload.worker_state()
    return generate_seam.render(worker.renderer, method, args, kwargs)


def process_multimodal_in_process(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A request's multimodal processing with the worker's renderer: the decoded
    images come in `args`, the processed inputs (their tensors) go back."""
    worker: RemoteWorker = offload.worker_state()
    return multimodal_seam.process(worker.renderer, args, kwargs)


def serving_spec(serving: Any) -> ServingSpec:
    attributes = {
        name: value for name, value in serving_seam.serving_attributes(serving).items() if _picklable(value)
    }
    blob = pickle.dumps((type(serving), attributes))
    return ServingSpec(key=f"{type(serving).__qualname__}-{id(serving)}", blob=blob)


def _picklable(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except Exception:
        return False
    return True


def postprocess_in_process(serving: ServingSpec, io_spec: IOProcessorSpec, ctx: Any) -> Any:
    worker: RemoteWorker = offload.worker_state()
    io = worker.io_processor(io_spec)
    return serving_seam.postprocess(worker.serving(serving, io), io, ctx)
