"""The public surface: `offload.__all__` is exactly what the package exports."""

from __future__ import annotations

import ast
import inspect
import pickle
import traceback
import types
from pathlib import Path

import offload


def test_all_lists_every_public_name() -> None:
    public = {
        name
        for name, value in vars(offload).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert set(offload.__all__) == public


def test_all_names_come_from_private_modules() -> None:
    for name in offload.__all__:
        module = getattr(getattr(offload, name), "__module__", "offload")
        assert module == "offload" or module.startswith("offload._"), (name, module)


def test_public_names_report_the_public_module() -> None:
    """`offload.Overloaded` in reprs and tracebacks, not a private module's path."""
    for name in offload.__all__:
        value = getattr(offload, name)
        if isinstance(value, type) or inspect.isfunction(value):
            assert value.__module__ == "offload", name
    assert repr(offload.Overloaded) == "<class 'offload.Overloaded'>"
    assert traceback.format_exception_only(offload.Overloaded("full"))[-1] == "offload.Overloaded: full\n"
    # Pickling (a worker process's error, sent back) finds them under that name.
    crashed = pickle.loads(pickle.dumps(offload.WorkerCrashed("gone")))
    assert type(crashed) is offload.WorkerCrashed
    assert crashed.args == ("gone",)


def test_builtin_strategies_are_registered() -> None:
    assert {"inline", "thread"} <= set(offload.STRATEGIES)
    assert isinstance(offload.STRATEGIES, tuple)


def test_error_hierarchy() -> None:
    assert issubclass(offload.ConfigError, offload.OffloadError)
    assert issubclass(offload.ConfigError, ValueError)
    assert issubclass(offload.WorkerCrashed, offload.OffloadError)
    assert issubclass(offload.ExecutorClosed, offload.OffloadError)


def test_concrete_strategies_are_final() -> None:
    from offload._registry import _registry

    for name in offload.STRATEGIES:
        cls = _registry.get(name)
        assert not inspect.isabstract(cls)
        assert getattr(cls, "__final__", False), f"{cls} should be @final"
        assert cls.name == name


def _imports(path: Path, package: str) -> set[str]:
    """The modules `path` imports of its own package, anywhere: at module
    level, under `TYPE_CHECKING` and inside functions (a circle that only a
    type annotation or a deferred import closes is still a circle)."""
    tree = ast.parse(path.read_text())
    top = package.split(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            if node.module:
                found.add(f"{base}.{node.module}")
            else:
                found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == top:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == top)
    return found


def _assert_no_import_circle(root: Path) -> None:
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        graph[name] = _imports(path, package)
    modules = set(graph)
    graph = {name: {m for m in imported if m in modules and m != name} for name, imported in graph.items()}
    # The package itself re-exports everything: only private modules matter.
    top = root.name
    graph.pop(top, None)
    state: dict[str, str] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if nxt == top:
                continue
            if state.get(nxt) == "open":
                raise AssertionError("import circle: " + " -> ".join([*trail, node, nxt]))
            if nxt not in state:
                visit(nxt, [*trail, node])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


def test_the_core_has_no_import_circle() -> None:
    _assert_no_import_circle(Path(offload.__file__).parent)


def test_the_vllm_adapter_has_no_import_circle() -> None:
    _assert_no_import_circle(Path(__file__).parents[1] / "adapters" / "vllm" / "offload_vllm")


def test_strategy_module_exports_what_it_lists() -> None:
    from offload import strategy

    public = {n for n, v in vars(strategy).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert set(strategy.__all__) == public - {"annotations"}


def test_testing_module_exports_what_it_lists() -> None:
    from offload import testing
    from offload.testing import _contract, _shm

    homes = {"BACKENDS": _contract, "StrategyContract": _contract, "shm_files": _shm}
    assert sorted(testing.__all__) == sorted(homes)
    for name, home in homes.items():
        assert getattr(testing, name) is getattr(home, name)


def test_the_contract_suites_functions_do_not_import_pytest() -> None:
    # A worker process unpickling one of them imports their module: pytest there
    # would cost every worker's start-up.
    import subprocess
    import sys

    code = "import sys, offload.testing._functions; print('pytest' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.stdout.strip() == "False", result.stderr
