"""What runs inside an offload worker: module-level functions, so `process` can pickle them.

Thread workers keep, per worker, a copy of each IO processor bound to a renderer
with the worker's own tokenizer. Process workers build their own renderer from
the served model's `VllmConfig` (sent once, as the initializer's argument) and
their own IO processors and serving shells from picklable specs, so only request
parameters, engine inputs and engine outputs cross the process boundary.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

import offload

from ._seams import renderer as renderer_seam
from ._seams import serving as serving_seam

#: Set in worker processes: the plugin, loaded again there by vLLM's model
#: registry, must not offload from inside a worker.
IN_WORKER_PROCESS = False


@dataclass
class ThreadWorker:
    """One worker thread's renderers: a tokenizer of its own per served renderer."""

    clones: dict[int, tuple[Any, Any]] = field(default_factory=dict)

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


def render_all_in_thread(io_processor: Any, render_params: list[Any]) -> list[Any]:
    """Several of one request's prompts in one call: one hand-off instead of one each."""
    own = offload.worker_state().io_processor(io_processor)
    return [own.render(params) for params in render_params]


@dataclass(frozen=True)
class IOProcessorSpec:
    """How a worker process rebuilds an IO processor: its class and chat-template config."""

    cls: type
    chat_template_config: Any

    def key(self) -> tuple[type, str]:
        # ChatTemplateConfig is an unhashable dataclass; its repr names every field.
        return (self.cls, repr(self.chat_template_config))


@dataclass
class ProcessWorker:
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


#: The title renderer worker processes show in `ps` (and how tests find them).
PROCESS_TITLE = "offload-vllm::renderer"


def init_process_worker(vllm_config: Any) -> ProcessWorker:
    global IN_WORKER_PROCESS
    IN_WORKER_PROCESS = True
    import setproctitle  # a vLLM dependency

    setproctitle.setproctitle(f"{PROCESS_TITLE} {vllm_config.model_config.served_model_name}")
    return ProcessWorker(vllm_config, renderer_seam.renderer_from_config(vllm_config))


def init_ray_worker(vllm_config: Any) -> ProcessWorker:
    """`init_process_worker` for a Ray actor, whose process title stays Ray's
    (`ray::RayWorker`, which Ray's own tools show)."""
    global IN_WORKER_PROCESS
    IN_WORKER_PROCESS = True
    return ProcessWorker(vllm_config, renderer_seam.renderer_from_config(vllm_config))


def render_in_process(spec: IOProcessorSpec, render_params: Any) -> Any:
    worker: ProcessWorker = offload.worker_state()
    return worker.io_processor(spec).render(render_params)


def render_all_in_process(spec: IOProcessorSpec, render_params: list[Any]) -> list[Any]:
    """Several of one request's prompts in one round trip: one message each way."""
    io = offload.worker_state().io_processor(spec)
    return [io.render(params) for params in render_params]


@dataclass(frozen=True)
class ServingSpec:
    """A serving object without its live parts, pickled once in the server (`blob`) and
    unpickled once per worker (`key`)."""

    key: str
    blob: bytes


def serving_spec(serving: Any) -> ServingSpec:
    state = {
        name: value
        for name, value in vars(serving).items()
        if name not in serving_seam.LIVE_ATTRIBUTES and _picklable(value)
    }
    blob = pickle.dumps((type(serving), state))
    return ServingSpec(key=f"{type(serving).__qualname__}-{id(serving)}", blob=blob)


def _picklable(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except Exception:
        return False
    return True


def postprocess_in_process(
    serving: ServingSpec, io_spec: IOProcessorSpec, ctx: Any
) -> Any:
    worker: ProcessWorker = offload.worker_state()
    shell = worker.servings.get(serving.key)
    io = worker.io_processor(io_spec)
    if shell is None:
        cls, state = pickle.loads(serving.blob)
        shell = cls.__new__(cls)
        vars(shell).update(state)
        shell.renderer = worker.renderer
        shell.io_processor = io
        worker.servings[serving.key] = shell
    return serving_seam.postprocess(shell, io, ctx)
