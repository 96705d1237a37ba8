"""What a request costs before it is rendered (per endpoint, on vLLM's own request
classes), how a large request is cut into pieces, a request's engine priority and
lane. No server."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from offload_vllm._cost import PIECE_COST, POSTPROCESS_COST_PER_VALUE, PROMPT_COST, split_by_cost
from offload_vllm._lanes import LaneRouter, UnknownLane
from offload_vllm._priority import engine_priority
from offload_vllm._seams.requests import (
    render_params_cost,
    request_cost,
    set_engine_priority,
    sets_own_priority,
)
from offload_vllm._seams.serving import postprocess_cost

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
    assert postprocess_cost(SimpleNamespace(final_res_batch=outputs)) == 3 * 384 * POSTPROCESS_COST_PER_VALUE
    assert postprocess_cost(SimpleNamespace(final_res_batch=[])) == 0


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
    with pytest.raises(UnknownLane, match="'bulk' is not a lane of this server; its lanes are default, ingest, query"):
        router.lane_for("/v1/embeddings", "bulk")


def test_a_truncated_text_is_priced_by_what_prefix_tokenization_reads() -> None:
    from offload_vllm._cost import characters, inputs_cost, truncated_cap

    for no_count in (None, -1, 0):
        assert truncated_cap(no_count) is None
    assert truncated_cap(True) is None  # a bool is not a token count
    assert truncated_cap(1) == 128
    assert truncated_cap(32) == 2 * 33 * 6
    long, short = "word " * 3000, "a short text"
    cap = 2 * 33 * 6
    assert characters([long, short], cap) == cap + len(short)
    assert characters([[101, 102, 103]], cap) == 3  # token ids are not text: never capped
    assert inputs_cost([long, long], cap) == 2 * (cap + 128)
