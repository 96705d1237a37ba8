"""`REQUIRED` checked against a vLLM release's source, without installing or importing it.

`python -m offload_vllm check-seams 'vllm==0.33.0'` downloads the release's
wheel alone (`pip download --no-deps`), reads its `.py` files from the zip
and parses them with `ast`; a directory holding the `vllm` package, or the
installed one (`--installed`), is read the same way. Each seam is reported
found (file and line) or missing (why). It answers "are the names still
there", not "does the adapter still work": behaviour is only tested end to
end, on the CPU build (docs/vllm.md#compatibility).

The one seam checker: the check at plugin load (`check_seams`) is
this one, run on the installed vLLM's source. Its rules, kind by kind
(`_seams.SeamKind`): a name a module binds, or that a class or one of its
bases binds; an annotated field; `self.<name> = ...` in a class's own
`__init__` (`instance_attributes`); and a function's parameters, by name.
Read from the source, not the imported modules, so that the adapter's own
patches of vLLM never hide a missing name.
"""

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

from . import _seams
from ._seams import Seam

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef

#: How many imports or base classes deep a name is followed: vLLM re-exports a
#: class once or twice at most; the bound only stops a cycle.
MAX_DEPTH = 8


class SeamCheckError(Exception):
    """The source to check could not be found, downloaded or read."""


class Location(NamedTuple):
    """Where a seam is bound: a path inside the source tree, 1-based line."""

    path: str
    line: int


class Finding(NamedTuple):
    """One seam's outcome: found at `location`, or missing because of `problem`."""

    seam: Seam
    location: Location | None
    problem: str | None = None


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


# ---- a source tree ------------------------------------------------------------


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


# ---- the check ----------------------------------------------------------------


def check_source(source: Source, required: tuple[Seam, ...] | None = None) -> list[Finding]:
    """Each seam of `required` (default `_seams.REQUIRED`), found (with its location) or
    missing (with why), in order."""
    return [_find(source, seam) for seam in (_seams.REQUIRED if required is None else required)]


def _find(source: Source, seam: Seam) -> Finding:
    module = source.module(seam.module)
    if module is None:
        return Finding(seam, None, f"no module {seam.module} in the source")
    if seam.owner is None:
        node = bindings(module.tree.body).get(seam.name)
        if node is None:
            return Finding(seam, None, "not in the module")
        return _checked(source, seam, module, node, seam.name)
    found = _find_class(source, module, seam.owner, 0)
    if found is None:
        return Finding(seam, None, f"no class {seam.owner}")
    owner_module, owner = found
    if seam.kind == "instance":
        init = bindings(owner.body).get("__init__")
        if not isinstance(init, FunctionNode):
            return Finding(seam, None, f"{seam.owner} defines no __init__ of its own")
        line = instance_attributes(init).get(seam.name)
        if line is None:
            return Finding(seam, None, f"{seam.owner}.__init__ does not set self.{seam.name}")
        return Finding(seam, Location(owner_module.path, line))
    for klass_module, klass in _with_bases(source, owner_module, owner):
        node = bindings(klass.body, fields=seam.kind == "field").get(seam.name)
        if node is not None:
            return _checked(source, seam, klass_module, node, seam.name)
    return Finding(seam, None, "not an annotated field" if seam.kind == "field" else "not an attribute")


def _checked(source: Source, seam: Seam, module: ParsedModule, node: ast.stmt, name: str) -> Finding:
    """A seam found bound by `node`: an import must resolve, and named parameters must be there."""
    location = Location(module.path, node.lineno)
    definition: ast.stmt | None = node
    if isinstance(node, ast.ImportFrom):
        resolved = _resolve_import(source, module, node, name, 0)
        if isinstance(resolved, str):
            return Finding(seam, None, resolved)
        definition = resolved
    if not seam.params:
        return Finding(seam, location)
    if not isinstance(definition, FunctionNode):
        return Finding(seam, None, "no signature to read")
    # Positional-only parameters cannot be passed by name; `**kwargs` does not
    # name them either (as `inspect.signature` does not, at plugin load).
    taken = {a.arg for a in definition.args.args + definition.args.kwonlyargs}
    lacking = [p for p in seam.params if p not in taken]
    if lacking:
        return Finding(seam, None, f"no parameter {', '.join(lacking)}")
    return Finding(seam, location)


def _import_target(module: ParsedModule, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _resolve_import(
    source: Source, module: ParsedModule, node: ast.ImportFrom, name: str, depth: int
) -> ast.stmt | str | None:
    """What `from X import name` in `module` binds: the defining statement, `None`
    for a module outside the source (not vLLM's, not checked) or a submodule, or
    why the import would fail."""
    original = next((a.name for a in node.names if (a.asname or a.name) == name), name)
    target_name = _import_target(module, node)
    target = source.module(target_name)
    if target is None or depth > MAX_DEPTH:
        return None
    bound = bindings(target.tree.body).get(original)
    if bound is None:
        if source.module(f"{target_name}.{original}") is not None:
            return None
        return f"imported from {target_name}, which does not define {original}"
    if isinstance(bound, ast.ImportFrom):
        return _resolve_import(source, target, bound, original, depth + 1)
    return bound


def _find_class(source: Source, module: ParsedModule, name: str, depth: int) -> tuple[ParsedModule, ast.ClassDef] | None:
    """The class `module` binds as `name`, following `from X import name`."""
    node = bindings(module.tree.body).get(name)
    if isinstance(node, ast.ClassDef):
        return module, node
    if isinstance(node, ast.ImportFrom) and depth <= MAX_DEPTH:
        original = next((a.name for a in node.names if (a.asname or a.name) == name), name)
        target = source.module(_import_target(module, node))
        if target is not None:
            return _find_class(source, target, original, depth + 1)
    return None


def _with_bases(source: Source, module: ParsedModule, klass: ast.ClassDef) -> Iterator[tuple[ParsedModule, ast.ClassDef]]:
    """`klass`, then its bases found in the source, nearest first (`Generic[T]` as
    `Generic`; bases outside the source, such as `ABC`, are skipped)."""
    pending = [(module, klass, 0)]
    seen: set[tuple[str, str]] = set()
    while pending:
        owner_module, owner, depth = pending.pop(0)
        if (owner_module.name, owner.name) in seen:
            continue
        seen.add((owner_module.name, owner.name))
        yield owner_module, owner
        if depth >= MAX_DEPTH:
            continue
        for base in owner.bases:
            if isinstance(base, ast.Subscript):
                base = base.value
            if isinstance(base, ast.Name):
                found = _find_class(source, owner_module, base.id, 0)
                if found is not None:
                    pending.append((*found, depth + 1))


def format_report(source: Source, findings: list[Finding]) -> str:
    """One line per seam, `found` with its file and line, `missing` with why."""
    missing = [f for f in findings if f.location is None]
    lines = [f"vLLM {source.version} ({source.label}): {len(findings) - len(missing)} of {len(findings)} seams found"]
    for finding in findings:
        if finding.location is not None:
            lines.append(f"found    {finding.seam.qualname}  {finding.location.path}:{finding.location.line}")
        else:
            lines.append(f"MISSING  {finding.seam.qualname}  ({finding.problem}; {finding.seam.description})")
    return "\n".join(lines)


def check_seams(required: tuple[Seam, ...] | None = None) -> list[str]:
    """The seams of `required` (default `_seams.REQUIRED`) missing from the installed vLLM,
    as `qualname (why; what)`; empty when all are there. Read from its source,
    by the same checker as `check-seams` (`check_source`)."""
    with open_source(installed_vllm()) as source:
        findings = check_source(source, _seams.REQUIRED if required is None else required)
    return [f"{f.seam.qualname} ({f.problem}; {f.seam.description})" for f in findings if f.location is None]


def require_supported_vllm() -> str:
    """Fail loudly, naming the version, if the seams are not where this adapter expects."""
    found = _seams.vllm_version()
    missing = check_seams()
    if missing:
        raise _seams.UnsupportedVLLMVersion(
            f"offload-vllm cannot work with vLLM {found}: missing {'; '.join(missing)}. "
            f"Tested versions: {', '.join(_seams.TESTED_VLLM_VERSIONS)}. Unset OFFLOAD_VLLM_STRATEGY "
            "and OFFLOAD_STRATEGY to serve with vLLM's own behaviour."
        )
    return found
