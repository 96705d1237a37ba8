"""The adapter's layout: vLLM is imported only where it is patched or read
(`_seams/`), so that the request policy, the settings and the launcher load
without it. No server, no vLLM import."""

from __future__ import annotations

import ast
from pathlib import Path

import offload_vllm

PACKAGE = Path(offload_vllm.__file__).parent


def _imports_vllm(path: Path) -> list[str]:
    """The statements of `path` that import vLLM, anywhere in it (inside functions too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        found += [f"{path.relative_to(PACKAGE)}:{node.lineno} {name}" for name in names if name.split(".")[0] == "vllm"]
    return found


def test_only_the_seams_import_vllm() -> None:
    outside = [path for path in sorted(PACKAGE.rglob("*.py")) if "_seams" not in path.relative_to(PACKAGE).parts]
    assert outside  # the walk found the package
    assert [line for path in outside for line in _imports_vllm(path)] == []


def test_the_seams_do_import_vllm() -> None:
    """The check above would see a vLLM import: it sees the seams'."""
    assert _imports_vllm(PACKAGE / "_seams" / "serving.py")
