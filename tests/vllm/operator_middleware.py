"""An operator's own ASGI middleware (vLLM's `--middleware`), for the server of
`test_door.py`: it removes the `X-Offload-Lane` header from requests that
carry `X-Operator-Strip: 1` (as a proxy or gateway would remove what clients
may not set), before anything behind it reads the header."""

from __future__ import annotations

from typing import Any


class StripLaneHeader:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and (b"x-operator-strip", b"1") in scope["headers"]:
            scope = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k != b"x-offload-lane"]}
        await self.app(scope, receive, send)
