"""ASGI middleware a test server loads as an operator's own (vLLM's `--middleware`).

For the server of `test_door.py`, `StripLaneHeader`: it removes the `X-Offload-Lane` header from requests that
carry `X-Operator-Strip: 1` (as a proxy or gateway would remove what clients
may not set), before anything behind it reads the header."""

from __future__ import annotations

import os
import time
from typing import Any
from urllib.parse import parse_qs


class StripLaneHeader:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and (b"x-operator-strip", b"1") in scope["headers"]:
            scope = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k != b"x-offload-lane"]}
        await self.app(scope, receive, send)


class BlockLoop:
    """For the health port's servers (`test_operations.py`, `test_api_servers.py`):
    a POST to `/offload-test/block-loop?seconds=N` blocks the event loop for N
    seconds (`time.sleep` on the loop's thread, as a stuck call would) and then
    answers 200, with the answering process's id in `X-Pid`; every other
    request passes on."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/offload-test/block-loop":
            seconds = float(parse_qs(scope["query_string"].decode()).get("seconds", ["1"])[0])
            time.sleep(seconds)  # noqa: ASYNC251 (blocking the loop is the point)
            headers = [(b"x-pid", str(os.getpid()).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        await self.app(scope, receive, send)
