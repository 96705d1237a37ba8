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
from collections.abc import Iterator
from typing import NamedTuple

from . import _seams
from ._seams import Seam
from ._vllm_source import (
    FunctionNode,
    ParsedModule,
    Source,
    bindings,
    installed_vllm,
    instance_attributes,
    open_source,
)

#: How many imports or base classes deep a name is followed: vLLM re-exports a
#: class once or twice at most; the bound only stops a cycle.
MAX_DEPTH = 8


class Location(NamedTuple):
    """Where a seam is bound: a path inside the source tree, 1-based line."""

    path: str
    line: int


class Finding(NamedTuple):
    """One seam's outcome: found at `location`, or missing because of `problem`."""

    seam: Seam
    location: Location | None
    problem: str | None = None


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
