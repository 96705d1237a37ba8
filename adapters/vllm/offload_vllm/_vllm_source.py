"""A vLLM release's source, read without installing or importing it: a wheel,
a directory, or the installed package (`open_source`, `installed_vllm`,
`download`), each module parsed once (`Source`), and what a module's or a
class's body binds (`bindings`, `instance_attributes`): what the seam checker
(`_seamcheck`) looks names up in."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple, final


class SeamCheckError(Exception):
    """The source to check could not be found, downloaded or read."""


FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def bindings(body: list[ast.stmt], *, fields: bool = False) -> dict[str, ast.stmt]:
    """The names a module or class body binds when it runs, each with its first
    binding statement: defs, classes, assignments, imports, also under `if`/`try`
    (not under `if TYPE_CHECKING:`, which never runs). With `fields`, only
    annotated names (`x: T`, with or without a value)."""
    found: dict[str, ast.stmt] = {}

    def bind(name: str, node: ast.stmt) -> None:
        found.setdefault(name, node)

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if fields or node.value is not None:
                    bind(node.target.id, node)
            elif fields:
                pass
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bind(node.name, node)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            bind(name.id, node)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    bind(alias.asname or alias.name.partition(".")[0], node)
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    bind(alias.asname or alias.name, node)
            if isinstance(node, ast.If):
                visit(node.orelse if _is_type_checking(node.test) else [*node.body, *node.orelse])
            elif isinstance(node, ast.Try):
                visit([*node.body, *(s for h in node.handlers for s in h.body), *node.orelse, *node.finalbody])

    visit(body)
    return found


def instance_attributes(function: FunctionNode) -> dict[str, int]:
    """The attributes `function` assigns on its first parameter (`self.x = ...`,
    `self.x: T = ...`, `self.a, self.b = ...`), each with its first line.
    Functions and classes nested in it are not its own code and are skipped."""
    arguments = function.args.posonlyargs + function.args.args
    if not arguments:
        return {}
    self_name = arguments[0].arg
    found: dict[str, int] = {}

    def targets(node: ast.expr) -> Iterator[ast.expr]:
        if isinstance(node, (ast.Tuple, ast.List)):
            for element in node.elts:
                yield from targets(element)
        elif isinstance(node, ast.Starred):
            yield from targets(node.value)
        else:
            yield node

    pending: list[ast.AST] = list(function.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        assigned: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            assigned = node.targets
        elif isinstance(node, ast.AnnAssign):
            assigned = [node.target]
        for target in (t for a in assigned for t in targets(a)):
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == self_name
            ):
                found[target.attr] = min(found.get(target.attr, target.lineno), target.lineno)
        pending.extend(ast.iter_child_nodes(node))
    return found


class ParsedModule(NamedTuple):
    """A module of the tree: its dotted name, its path in the tree, its AST."""

    name: str
    path: str
    is_package: bool
    tree: ast.Module


@final
class Source:
    """The Python files of a vLLM release, read by path inside the tree
    (`vllm/renderers/base.py`); modules are parsed once, on first use."""

    def __init__(self, label: str, read: Callable[[str], str | None]) -> None:
        self.label = label
        self._read = read
        self._modules: dict[str, ParsedModule | None] = {}

    def module(self, name: str) -> ParsedModule | None:
        """The parsed module `name`, or `None` where the tree has no source for it."""
        if name not in self._modules:
            self._modules[name] = self._load(name)
        return self._modules[name]

    def _load(self, name: str) -> ParsedModule | None:
        stem = name.replace(".", "/")
        for path, is_package in ((f"{stem}.py", False), (f"{stem}/__init__.py", True)):
            text = self._read(path)
            if text is not None:
                try:
                    return ParsedModule(name, path, is_package, ast.parse(text, filename=path))
                except SyntaxError as exc:
                    raise SeamCheckError(f"{self.label}: cannot parse {path}: {exc}") from exc
        return None

    @property
    def version(self) -> str:
        """`vllm/_version.py`'s `__version__`, or `unknown`."""
        module = self.module("vllm._version")
        node = None if module is None else bindings(module.tree.body).get("__version__")
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            return str(node.value.value)
        return "unknown"


@contextlib.contextmanager
def open_source(path: Path) -> Iterator[Source]:
    """A wheel or any zip with `vllm/` at its root, or a directory that holds the
    `vllm` package (or is it)."""
    if path.is_file():
        try:
            archive = zipfile.ZipFile(path)
        except zipfile.BadZipFile as exc:
            raise SeamCheckError(f"{path} is not a wheel or zip: {exc}") from exc
        with archive:
            names = set(archive.namelist())

            def read_member(inner: str) -> str | None:
                return archive.read(inner).decode("utf-8") if inner in names else None

            yield Source(path.name, read_member)
        return
    if (path / "vllm" / "__init__.py").is_file():
        root = path
    elif path.name == "vllm" and (path / "__init__.py").is_file():
        root = path.parent
    else:
        raise SeamCheckError(f"{path} is neither a wheel nor a directory holding the vllm package")

    def read_file(inner: str) -> str | None:
        file = root / inner
        return file.read_text("utf-8") if file.is_file() else None

    yield Source(str(root / "vllm"), read_file)


def installed_vllm() -> Path:
    """The installed `vllm` package's directory, found without importing it."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise SeamCheckError("no vllm package is installed in this environment")
    return Path(next(iter(spec.submodule_search_locations)))


def download(requirement: str, cache: Path) -> Path:
    """The wheel `pip download --no-deps --only-binary=:all: requirement` picks for
    this machine, kept in `cache/<requirement>/` (a second call finds it there)."""
    target = cache / re.sub(r"[^A-Za-z0-9._-]+", "_", requirement)
    target.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--quiet", requirement, "-d", str(target),
    ]
    proc = subprocess.run(command, check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SeamCheckError(f"pip could not download {requirement!r}:\n{proc.stderr.strip()}")
    wheels = sorted(target.glob("*.whl"))
    if len(wheels) != 1:
        # An unpinned requirement may have fetched a newer release next to an
        # older one: which one was meant is not for this tool to guess.
        raise SeamCheckError(
            f"expected one wheel in {target}, found {len(wheels)}; remove the stale ones or pin a version"
        )
    return wheels[0]
