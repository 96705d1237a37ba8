"""Seam: `vllm/entrypoints/pooling/base/serving.py`, `PoolingBaseServing.__init__`,
`_preprocessing`, and the `__call__` of every pooling serving class.

vLLM sets `self._postprocessing_async = make_async(self._postprocessing,
executor=renderer._executor)` in `__init__`; `__call__` (and the scoring
entrypoints) await it to turn engine outputs into the response body. We let
vLLM build the serving object, then hand it to the runtime (`install`),
which replaces `_postprocessing_async` with the strategy's.

`PoolingBaseServing._preprocessing` renders each of a request's prompts with
its own `render_async` call, gathered: a request of 32 texts is 32 hand-offs
(under `process`, 32 round trips, each pickled both ways). Where the IO
processor has a `render_all` (`io_processor.render_all`), `install_preprocessing`
hands it all of them at once (it renders them in pieces); an empty request
still goes through vLLM's own code, for vLLM's own error.

Every online pooling request (embeddings, pooling, classify, score, rerank,
`/v2/embed`) enters a pooling serving object's `__call__` before anything is
rendered: there it is admitted (`install_admission`, the policy in
`_admission.py`). `PoolingBaseServing.__call__` is one entry, but a
serving class may define its own: `ServingScores.__call__` runs
late-interaction scoring (`flash_late_interaction`) without calling the base
one. So every `__call__` defined along a served class's bases is wrapped
(`cover`, as each serving object is built), and a request is admitted at the
first one it enters; the ones it enters from there find it admitted.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Coroutine
from typing import Any

from vllm.entrypoints.pooling.base.serving import (
    PoolingBaseServing,
)

from .. import _phases as phases
from .._admission import RequestPolicy, content_length
from .._cost import (
    ECHO_COST_PER_CHARACTER,
    POSTPROCESS_COST_PER_OUTPUT,
    POSTPROCESS_COST_PER_VALUE,
    characters,
)
from . import io_processor as io_processor_seam
from . import requests as requests_seam

PostprocessAsync = Callable[[Any, Any], Coroutine[Any, Any, Any]]

_ORIGINAL_INIT: Callable[..., None] = PoolingBaseServing.__init__
_ORIGINAL_PREPROCESSING: Callable[..., Coroutine[Any, Any, None]] = PoolingBaseServing._preprocessing

#: Attributes of a serving object that hold live server machinery (engine client,
#: thread pools, the renderer): never sent to a worker process.
LIVE_ATTRIBUTES = frozenset(
    {
        "engine_client",
        "models",
        "renderer",
        "request_logger",
        "io_processor",
        "io_processors",
        "_executor",
        "_postprocessing_async",
    }
)


def install(on_built: Callable[[Any], PostprocessAsync | None]) -> None:
    """`on_built(serving)` is called on every pooling serving object vLLM builds,
    once vLLM's `__init__` is done, and gives its `_postprocessing_async`
    (`None`: vLLM's own)."""
    if getattr(PoolingBaseServing.__init__, "__offload_vllm__", False):
        return

    @functools.wraps(_ORIGINAL_INIT)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _ORIGINAL_INIT(self, *args, **kwargs)
        replacement = on_built(self)
        if replacement is not None:
            self._postprocessing_async = replacement

    __init__.__offload_vllm__ = True  # type: ignore[attr-defined]
    PoolingBaseServing.__init__ = __init__  # type: ignore[method-assign]


def install_preprocessing() -> None:
    """Render a request's prompts with its processor's `render_all` (where it
    has one)."""
    if getattr(PoolingBaseServing._preprocessing, "__offload_vllm__", False):
        return

    @functools.wraps(_ORIGINAL_PREPROCESSING)
    async def _preprocessing(self: Any, io_processor: Any, ctx: Any) -> None:
        render_all = io_processor_seam.render_all(io_processor)
        if render_all is None:
            return await _ORIGINAL_PREPROCESSING(self, io_processor, ctx)
        requests = io_processor.get_request_factory_online(ctx)
        if len(requests) == 0:
            return await _ORIGINAL_PREPROCESSING(self, io_processor, ctx)
        ctx.engine_inputs = await render_all(list(requests))
        return None

    timed = phases.timing_render(_preprocessing)
    timed.__offload_vllm__ = True  # type: ignore[attr-defined]
    PoolingBaseServing._preprocessing = timed  # type: ignore[method-assign]


def postprocess(serving: Any, io_processor: Any, ctx: Any) -> Any:
    """vLLM's own synchronous post-processing (`post_process_online` + `_build_response`)."""
    return serving._postprocessing(io_processor, ctx)


def postprocess_cost(ctx: Any) -> float:
    """What building the response of `ctx` costs (`_cost.py`): its engine
    outputs (each one's object in the answer) and their values (an
    embedding's floats, a score), counted without copying, and the characters
    of the request it carries back (`requests.echoed`: a rerank answer's
    documents), read as pricing reads a request."""
    outputs = ctx.final_res_batch or ()
    values = sum(output.outputs.data.numel() for output in outputs)
    echoed = characters(requests_seam.echoed(ctx.request))
    return float(
        len(outputs) * POSTPROCESS_COST_PER_OUTPUT
        + values * POSTPROCESS_COST_PER_VALUE
        + echoed * ECHO_COST_PER_CHARACTER
    )


def strip_context(ctx: Any) -> Any:
    """A copy of a `PoolingServeContext` without the live request and result stream,
    for sending to a worker process (post-processing reads neither)."""
    clone = copy.copy(ctx)
    clone.raw_request = None
    clone.result_generator = None
    return clone


def serving_attributes(serving: Any) -> dict[str, Any]:
    """A serving object's attributes but its live ones (`LIVE_ATTRIBUTES`)."""
    return {name: value for name, value in vars(serving).items() if name not in LIVE_ATTRIBUTES}


def rebuild_shell(cls: type[Any], attributes: dict[str, Any], renderer: Any, io_processor: Any) -> Any:
    """A serving object of `cls` with `attributes`, its renderer and IO
    processor the worker's own: enough for `postprocess`, never for a request."""
    shell: Any = object.__new__(cls)
    vars(shell).update(attributes)
    shell.renderer = renderer
    shell.io_processor = io_processor
    return shell


# ---- admission: the `__call__` of every pooling serving class ----------------

_policy: RequestPolicy | None = None


def install_admission(policy: RequestPolicy) -> None:
    """Admit every pooling request by `policy` (`cover` each serving class as it is used)."""
    global _policy
    _policy = policy
    cover(PoolingBaseServing)


def cover(cls: type) -> None:
    """Wrap every `__call__` defined along `cls`'s bases, from `PoolingBaseServing`
    down, once (a no-op before `install_admission`)."""
    if _policy is None:
        return
    for klass in cls.__mro__:
        own = vars(klass).get("__call__")
        if own is not None and issubclass(klass, PoolingBaseServing) and not getattr(own, "__offload_vllm__", False):
            setattr(klass, "__call__", admitting(own, _policy))  # noqa: B010


def admitting(
    original: Callable[..., Coroutine[Any, Any, Any]],
    policy: RequestPolicy,
    takes_images: Callable[[Any], bool] = requests_seam.takes_images,
) -> Callable[..., Coroutine[Any, Any, Any]]:
    """`original(self, request, raw_request)` (a pooling `__call__`, a generate
    route's handler) run inside the request's admission by `policy`, or the
    answer that refuses it; `takes_images(self)`: whether the served model
    takes images (how a pooling request's inputs are priced)."""

    @functools.wraps(original)
    async def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        # vLLM's `(request, raw_request)`.
        request = args[0] if args else kwargs["request"]
        raw_request = args[1] if len(args) > 1 else kwargs.get("raw_request")
        scope = None if raw_request is None else raw_request.scope

        def cost_of() -> float:
            body = 0 if scope is None else content_length(scope)
            return requests_seam.request_cost(request, body, multimodal=takes_images(self))

        set_priority = (
            None
            if requests_seam.sets_own_priority(request)
            else functools.partial(requests_seam.set_engine_priority, request)
        )
        # A request's truncated texts and pairs are read at admission, and not again to cut its rendering into pieces.
        with requests_seam.pricing_texts():
            return await policy.admit(
                scope,
                cost_of,
                set_priority,
                lambda: original(self, *args, **kwargs),
                engine_requests_of=lambda: requests_seam.engine_requests(request),
            )

    __call__.__offload_vllm__ = True  # type: ignore[attr-defined]
    return __call__
