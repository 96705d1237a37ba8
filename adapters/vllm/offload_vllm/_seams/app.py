"""Seam: `vllm/entrypoints/launchers/app.py`, `build_app`'s call of
`init_entrypoints_middleware(args, app, supported_tasks)`: where vLLM's
server arguments (`--host`) and its app are first seen together.

The adapter replaces that binding once (`install`): `on_app(args, app)` runs
first, then whatever was bound (vLLM's, or another seam's wrapper). A
middleware `on_app` adds therefore sits inside the middleware added by a
wrapper installed after this one (`admission.install_door`), and outside
vLLM's own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

_MARK = "__offload_vllm_app__"


def install(on_app: Callable[[Any, Any], None]) -> None:
    """Call `on_app(args, app)` as vLLM builds its app. Idempotent."""
    from vllm.entrypoints.launchers import app as app_module

    original: Callable[..., None] = getattr(app_module, "init_entrypoints_middleware")  # noqa: B009
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def init_entrypoints_middleware(args: Any, app: Any, supported_tasks: Any) -> None:
        on_app(args, app)
        original(args, app, supported_tasks)

    setattr(init_entrypoints_middleware, _MARK, True)
    setattr(app_module, "init_entrypoints_middleware", init_entrypoints_middleware)  # noqa: B010


def host(args: Any) -> str | None:
    """vLLM's `--host` (`None`: every interface)."""
    value = getattr(args, "host", None)
    return None if value is None else str(value)
