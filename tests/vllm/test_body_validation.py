"""`/v1/embeddings` validates its body as vLLM does, without the chat-input
members a value in `input` rules out (`_seams/validation.py`).

Each property builds the route as vLLM registers it (its `APIRouter` in a
FastAPI app) twice, one with the shortcut and one without, and holds the
first to the second over generated bodies: the same request model, fields
and fields set, or the same errors, word for word.
"""

from __future__ import annotations

import copy
import functools
import random
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from offload_vllm._seams import app as app_seam
from offload_vllm._seams import validation
from pydantic import BaseModel, ValidationError
from vllm.entrypoints.launchers import app as app_module
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.entrypoints.pooling.embed import protocol
from vllm.entrypoints.pooling.embed.api_router import router
from vllm.utils.argparse_utils import FlexibleArgumentParser

PATH = "/v1/embeddings"


def embeddings_field(app: FastAPI) -> Any:
    (route,) = [r for r in app.routes if isinstance(r, APIRoute) and r.path == PATH]
    return route.body_field


def vllm_app() -> FastAPI:
    app = FastAPI()
    app.include_router(router)
    return app


@pytest.fixture(scope="module")
def fields() -> tuple[Any, Any]:
    """The body field of `/v1/embeddings` with the shortcut, and vLLM's own."""
    ours = vllm_app()
    assert validation.shortcut_routes(ours) == [PATH]
    return embeddings_field(ours), embeddings_field(vllm_app())


# ---- bodies ------------------------------------------------------------------

token_ids = st.integers(-5, 70_000)
words = st.text(alphabet="ab é漢", max_size=8)
parts = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "nope"]), "text": words})
messages = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "developer", "tool"]) | st.integers(0, 3)},
    optional={"content": words | st.lists(parts, max_size=2) | st.integers(0, 3), "name": words},
)
#: Messages every chat form accepts, so that several union members match one body.
valid_messages = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]), "content": words})
conversations = st.lists(valid_messages, min_size=1, max_size=3)
scalars = token_ids | words | st.floats(allow_nan=False, width=16) | st.booleans() | st.none()
#: What `input` may hold: what each request form takes (ids, texts, a
#: conversation, a batch of them), and mixtures of them at every depth.
inputs = st.recursive(
    scalars | messages,
    lambda inner: st.lists(inner, max_size=5),
    max_leaves=24,
) | conversations | st.lists(conversations, min_size=1, max_size=2)
bodies = st.fixed_dictionaries(
    {"input": inputs},
    optional={
        "model": words,
        "messages": st.lists(messages, max_size=3) | conversations | st.lists(conversations, min_size=1, max_size=2),
        "truncate_prompt_tokens": st.integers(-2, 40),
        "dimensions": st.integers(0, 4),
        "encoding_format": st.sampled_from(["float", "base64", "bits"]),
        "add_special_tokens": st.booleans(),
        "normalize": st.booleans(),
        "task": st.sampled_from(["embed", "encode", "classify"]),
    },
) | st.lists(token_ids, max_size=3) | words | st.fixed_dictionaries({"model": words})


def comparable(answer: tuple[Any, list[Any]]) -> Any:
    """A validation's answer, minus what differs between two validations of the
    same body: a field filled by a default factory (a fresh request id), and
    the identity of an exception in an error's context."""
    value, errors = answer
    if isinstance(value, BaseModel):
        fresh = {n for n, f in type(value).model_fields.items() if f.default_factory is not None}
        unset_fresh = fresh - value.model_fields_set
        # JSON mode: an iterable field (a message's `content`) is a lazy iterator otherwise.
        value = (type(value), value.model_dump(mode="json", exclude=unset_fresh), value.model_fields_set)
    return value, [{k: (repr(v) if k == "ctx" else v) for k, v in e.items()} for e in errors]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies)
def test_same_answer_as_vllms_union(fields: tuple[Any, Any], body: Any) -> None:
    ours, theirs = fields
    assert answer(ours, body) == answer(theirs, body)
    # Sound on its own, not only through the full validation a refusal falls back to.
    for member in shortcut().ruled_out(body):
        with pytest.raises(ValidationError):
            member.model_validate(body, from_attributes=True)


def answer(field: Any, body: Any) -> Any:
    """What `field` answers `body`, comparable; or the exception it raises
    (vLLM's handlers answer its own, `VLLMValidationError`, with a 400)."""
    try:
        return comparable(field.validate(copy.deepcopy(body), {}, loc=("body",)))
    except Exception as exc:  # any exception: the same one, or a difference
        return type(exc), str(exc)


# ---- the shortcut is taken, and only where it is proven -----------------------


@functools.cache
def shortcut() -> validation.UnionShortcut:
    # One for the module: building one takes tens of milliseconds (a
    # TypeAdapter per set of members ruled out), and it holds no state.
    return validation.UnionShortcut(protocol.EmbeddingRequest, [])


def refuse_full(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("validated against the full union")


@pytest.mark.parametrize(
    "value",
    [
        [[random.Random(i).randrange(30_000) for _ in range(512)] for i in range(16)],  # a batch of ids
        list(range(2048)),  # one prompt of ids
        ["some text"] * 16,
        "one text",
    ],
    ids=["batch-of-ids", "ids", "texts", "text"],
)
def test_ids_and_texts_skip_the_chat_input_models(value: Any) -> None:
    body = {"model": "m", "input": value}
    assert shortcut().ruled_out(body) == set(validation.CHAT_INPUT_MEMBERS)
    request, errors = shortcut().validate(body, refuse_full, {}, loc=("body",))
    assert errors == []
    assert isinstance(request, protocol.EmbeddingCompletionRequest)
    assert request.input == value


@pytest.mark.parametrize(
    "value",
    [
        [{"role": "user", "content": "hi"}],  # a conversation: may be one
        [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}]],  # a batch of them
        [],
        [[]],
    ],
    ids=["conversation", "batch-of-conversations", "empty", "empty-inner"],
)
def test_a_chat_member_is_ruled_out_only_where_it_cannot_match(value: Any) -> None:
    """A conversation rules out the batch member, a batch the one-conversation
    member; an empty input neither: vLLM's full union decides."""
    calls = []

    def full(body: Any, values: dict[str, Any], *, loc: tuple[Any, ...]) -> Any:
        calls.append(body)
        return "full", []

    body = {"input": value}
    skipped = shortcut().ruled_out(body)
    assert not any(_could_match(member, value) for member in skipped)
    if not skipped:
        assert shortcut().validate(body, full, {}, loc=("body",)) == ("full", [])
        assert calls == [body]


def _could_match(member: type[BaseModel], value: Any) -> bool:
    try:
        member.model_validate({"input": value})
    except ValueError:
        return False
    return True


def test_a_body_the_smaller_union_refuses_gets_vllms_errors() -> None:
    """Ruled out, but refused by the rest too: validated again in full, so the
    errors name every member, as vLLM's do."""
    calls = []

    def full(body: Any, values: dict[str, Any], *, loc: tuple[Any, ...]) -> Any:
        calls.append(loc)
        return None, ["vLLM's own"]

    body = {"input": [[1, 2, "x"]]}
    assert shortcut().ruled_out(body)
    assert shortcut().validate(body, full, {}, loc=("body",)) == (None, ["vLLM's own"])
    assert calls == [("body",)]


def test_fastapi_takes_the_shortcut(fields: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The route's own field answers a batch of ids without its full validation
    (FastAPI's `ModelField._type_adapter`, which the full path calls)."""
    ours, _ = fields
    monkeypatch.setattr(ours, "_type_adapter", None)  # the full path would fail on it
    request, errors = ours.validate({"input": [[7] * 300] * 4}, {}, loc=("body",))
    assert errors == []
    assert isinstance(request, protocol.EmbeddingCompletionRequest)
    with pytest.raises(AttributeError):  # where nothing rules a member out, the full way
        ours.validate({"input": []}, {}, loc=("body",))


def test_installed_where_vllm_builds_its_app(monkeypatch: pytest.MonkeyPatch) -> None:
    """The app seam with the shortcut's hook gives the routes their shortcut
    when vLLM adds its middleware (its routes are in by then), then runs
    vLLM's own function; installed twice is once."""
    monkeypatch.setattr(app_module, "init_entrypoints_middleware", app_module.init_entrypoints_middleware)
    app_seam.install(validation.shortcut_validation)
    app_seam.install(validation.shortcut_validation)
    app = vllm_app()
    args = make_arg_parser(FlexibleArgumentParser()).parse_args([])  # `vllm serve`'s defaults
    app_module.init_entrypoints_middleware(args, app, ("embed",))
    field = embeddings_field(app)
    assert getattr(field.validate, "__offload_vllm_validation__", False)
    full = field.validate.__kwdefaults__["_full"]
    assert not getattr(full, "__offload_vllm_validation__", False)  # wrapped once, not twice
    assert any("CORSMiddleware" in repr(m) for m in app.user_middleware)  # vLLM's own ran


def test_a_fastapi_without_the_field_method_keeps_vllms_validation(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Where FastAPI's body field no longer validates through `validate`, the
    route is left as vLLM built it, and the server says so."""
    app = vllm_app()
    field = embeddings_field(app)
    monkeypatch.delattr(type(field), "validate")
    with caplog.at_level("WARNING", logger="vllm.offload_vllm"):
        assert validation.shortcut_routes(app) == []
    assert "/v1/embeddings validates its body as vLLM does" in caplog.text
    assert "/v2/embed" not in caplog.text  # a route without chat-input models is not concerned
    assert "validate" not in vars(field)
