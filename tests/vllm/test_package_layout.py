"""The adapter's layout: vLLM is imported only where it is patched or read
(`_seams/`), so that the request policy, the settings and the launcher load
without it. No server, no vLLM import."""

from __future__ import annotations

import ast
import re
import textwrap
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


def _diagram_in_docs() -> str:
    docs = (PACKAGE.parents[2] / "docs" / "vllm.md").read_text()
    section = docs.split("## The path of a request", 1)[1]
    return section.split("```text\n", 1)[1].split("```", 1)[0].rstrip()


def test_the_request_path_diagram_is_the_same_in_the_docs_and_names_modules_that_exist() -> None:
    """The diagram opening `offload_vllm/__init__.py` is docs/vllm.md's, and each
    module it names is in the package."""
    diagram = _diagram_in_docs()
    doc = offload_vllm.__doc__ or ""
    assert textwrap.indent(diagram, "    ") in doc
    named = set(re.findall(r"(?:_[a-z_]+/)?_?[a-z_]+\.py|_[a-z_]+/", diagram))
    assert {"_admission.py", "_placements/", "_seams/errors.py"} <= named
    missing = [name for name in named if not (PACKAGE / name).exists() and not (PACKAGE / "_seams" / name).exists()]
    assert missing == []
