"""vLLM's pooling routes (`vllm/entrypoints/pooling/*/api_router.py`), its
generate routes (`vllm/entrypoints/openai/{chat_completion,completion,responses}/api_router.py`) and how
its middleware reads a request's route (`vllm/entrypoints/serve/middleware/authenticate.py`).

Imports no vLLM: the settings name routes (`OFFLOAD_VLLM_LANE_ROUTES`) and are
checked where vLLM is not loaded (the launcher). Paths in decorators are not
names the seam check can look for: a route vLLM drops is caught by the
end-to-end tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: vLLM's pooling routes, each as it is registered (without any `--root-path`).
POOLING_PATHS = frozenset(
    {
        "/classify",
        "/pooling",
        "/rerank",
        "/score",
        "/v1/embeddings",
        "/v1/rerank",
        "/v1/score",
        "/v2/embed",
        "/v2/rerank",
    }
)


#: vLLM's generate routes that offload admits (`_seams/generate.py`): chat,
#: completions and the Responses API's create (not its retrieve or cancel).
GENERATE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses"})

#: The routes whose requests offload admits, prices and times: pooling and generate.
ADMITTED_PATHS = POOLING_PATHS | GENERATE_PATHS


def route_of(scope: Mapping[str, Any]) -> str:
    """The route an ASGI request asks for: its path without the server's root
    path, read as vLLM's own middleware reads it (`AuthenticationMiddleware`):
    behind a proxy served with `--root-path /api`, `/api/v1/embeddings` and
    `/v1/embeddings` are both `/v1/embeddings`."""
    path: str = scope["path"]
    return path.removeprefix(scope.get("root_path", ""))


def is_pooling_request(scope: Mapping[str, Any]) -> bool:
    """Whether `scope` is an HTTP POST to one of vLLM's pooling routes."""
    return scope["type"] == "http" and scope.get("method") == "POST" and route_of(scope) in POOLING_PATHS


def is_admitted_request(scope: Mapping[str, Any]) -> bool:
    """Whether `scope` is an HTTP POST to a route offload admits (`ADMITTED_PATHS`)."""
    return scope["type"] == "http" and scope.get("method") == "POST" and route_of(scope) in ADMITTED_PATHS
