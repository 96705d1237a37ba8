"""AST walks over vLLM's source, shared by the seam check at plugin load
(`_seams`) and the check of a release's source (`_seamcheck`): below both."""

from __future__ import annotations

import ast
from collections.abc import Iterator

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def parse_function(source: str) -> FunctionNode | None:
    """The function defined by `source` (one `def`, as `inspect.getsource` gives it)."""
    body = ast.parse(source).body
    return body[0] if body and isinstance(body[0], FunctionNode) else None


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
