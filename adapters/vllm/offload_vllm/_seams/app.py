"""Seam: `vllm/entrypoints/launchers/app.py`, `build_app`'s call of
`init_entrypoints_middleware(args, app, supported_tasks)`: where vLLM's
server arguments (`--host`) and its app, routes in, are first seen together.

The one place the adapter replaces that binding (`install`): its hooks run
in the order given, then vLLM's own. A middleware a hook adds therefore sits
inside vLLM's (CORS, `--api-key` authentication, `--middleware`), and, as
Starlette makes the last added the outermost, inside those added by the
hooks after it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

#: On the installed binding: the names of its hooks, in order.
HOOKS_MARK = "__offload_vllm_app__"

AppHook = Callable[[Any, Any], None]


def install(*hooks: AppHook) -> None:
    """Call each `hook(args, app)`, in order, as vLLM builds its app, before
    vLLM adds its own middleware. Once: a second call changes nothing."""
    from vllm.entrypoints.launchers import app as app_module

    original: Callable[..., None] = getattr(app_module, "init_entrypoints_middleware")  # noqa: B009
    if getattr(original, HOOKS_MARK, None) is not None:
        return

    @functools.wraps(original)
    def init_entrypoints_middleware(args: Any, app: Any, supported_tasks: Any) -> None:
        for hook in hooks:
            hook(args, app)
        original(args, app, supported_tasks)

    setattr(init_entrypoints_middleware, HOOKS_MARK, tuple(hook.__name__ for hook in hooks))
    setattr(app_module, "init_entrypoints_middleware", init_entrypoints_middleware)  # noqa: B010


def host(args: Any) -> str | None:
    """vLLM's `--host` (`None`: every interface)."""
    value = getattr(args, "host", None)
    return None if value is None else str(value)
