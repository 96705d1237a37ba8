"""The seam checker (`_seamcheck`, vLLM's source read with `ast`), run on a
release's source and, at plugin load, on the installed vLLM's
(`_seamcheck.check_seams`): on a small fake package and on the installed vLLM. No server."""

from __future__ import annotations

import asyncio
import textwrap
import zipfile
from pathlib import Path

import pytest
from offload_vllm import _seamcheck, _seams
from offload_vllm.__main__ import main
from offload_vllm._seams import Seam

# A package in the shape of vLLM's internals, with one of each thing a seam can be.
FAKE_FILES = {
    "__init__.py": "",
    "_version.py": "__version__ = version = '9.9.9'\n",
    "base.py": """
        from typing import TYPE_CHECKING, Generic, TypeVar

        if TYPE_CHECKING:
            from .reexport import Thing as HiddenThing

        T = TypeVar("T")


        class Root:
            def inherited(self):
                pass


        class Thing(Root, Generic[T]):
            declared: int
            with_default: int = 1

            def __init__(self, config, *, renderer=None):
                self.present = config
                if config:
                    self.first, self.second = 1, 2

                def later():
                    self.nested = 1

                self.callback = later

            def method(self, x, *, keyword=None):
                return x

            @staticmethod
            def static(token_ids, *, offset_mapping=None):
                return token_ids


        class NoInit(Root):
            pass


        def function(a, b, /, c):
            return a
    """,
    "reexport.py": """
        from .base import Thing as Thing
    """,
    # Its import fails at run time: every name in it is missing, statically too.
    "broken.py": """
        from .base import gone as gone
    """,
}

# (seam, found?): what both checkers must say.
CASES = [
    (Seam("vllm.base", None, "function"), True),
    (Seam("vllm.base", None, "function", params=("c",)), True),
    # Positional-only: cannot be passed by name.
    (Seam("vllm.base", None, "function", params=("a",)), False),
    (Seam("vllm.base", None, "HiddenThing"), False),
    (Seam("vllm.base", None, "absent"), False),
    (Seam("vllm.base", "Thing", "method", params=("keyword",)), True),
    (Seam("vllm.base", "Thing", "method", params=("keyword", "absent")), False),
    (Seam("vllm.base", "Thing", "static", params=("offset_mapping",)), True),
    (Seam("vllm.base", "Thing", "inherited"), True),
    (Seam("vllm.base", "Thing", "with_default"), True),
    # Annotated without a value: a field, not a class attribute.
    (Seam("vllm.base", "Thing", "declared"), False),
    (Seam("vllm.base", "Thing", "declared", "field"), True),
    (Seam("vllm.base", "Thing", "with_default", "field"), True),
    (Seam("vllm.base", "Thing", "method", "field"), False),
    (Seam("vllm.base", "Thing", "present", "instance"), True),
    (Seam("vllm.base", "Thing", "second", "instance"), True),
    # Set by a callback __init__ defines but does not run.
    (Seam("vllm.base", "Thing", "nested", "instance"), False),
    (Seam("vllm.base", "Thing", "absent", "instance"), False),
    # A class attribute is no instance attribute set in __init__.
    (Seam("vllm.base", "Thing", "with_default", "instance"), False),
    (Seam("vllm.base", "NoInit", "present", "instance"), False),
    (Seam("vllm.base", "Absent", "method"), False),
    (Seam("vllm.reexport", "Thing", "present", "instance"), True),
    (Seam("vllm.reexport", None, "Thing"), True),
    (Seam("vllm.broken", None, "gone"), False),
    (Seam("vllm.nowhere", None, "anything"), False),
]


def _write_package(root: Path, top: str) -> None:
    for name, text in FAKE_FILES.items():
        path = root / top / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def _fake_wheel(tmp_path: Path, *, drop: str | None = None) -> Path:
    wheel = tmp_path / "vllm-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in FAKE_FILES.items():
            if name != drop:
                archive.writestr(f"vllm/{name}", textwrap.dedent(text))
        archive.writestr("vllm-9.9.9.dist-info/METADATA", "Name: vllm\nVersion: 9.9.9\n")
    return wheel


def _found(findings: list[_seamcheck.Finding]) -> list[tuple[Seam, bool]]:
    return [(f.seam, f.location is not None) for f in findings]


def test_static_check_of_a_wheel(tmp_path: Path) -> None:
    with _seamcheck.open_source(_fake_wheel(tmp_path)) as source:
        findings = _seamcheck.check_source(source, tuple(seam for seam, _ in CASES))
        assert source.version == "9.9.9"
    assert _found(findings) == CASES
    where = {f.seam: f.location for f in findings}
    assert where[Seam("vllm.base", "Thing", "present", "instance")] == ("vllm/base.py", 20)
    assert where[Seam("vllm.base", "Thing", "second", "instance")] == ("vllm/base.py", 22)
    # Found in the base class that defines it, and through the re-export.
    assert where[Seam("vllm.base", "Thing", "inherited")] == ("vllm/base.py", 11)
    assert where[Seam("vllm.reexport", "Thing", "present", "instance")] == ("vllm/base.py", 20)
    problems = {f.seam: f.problem for f in findings}
    assert problems[Seam("vllm.broken", None, "gone")] == "imported from vllm.base, which does not define gone"
    assert problems[Seam("vllm.base", "Thing", "absent", "instance")] == "Thing.__init__ does not set self.absent"
    assert problems[Seam("vllm.base", "Thing", "method", params=("keyword", "absent"))] == "no parameter absent"


def test_static_check_of_a_directory_agrees_with_the_wheel(tmp_path: Path) -> None:
    _write_package(tmp_path / "tree", "vllm")
    seams = tuple(seam for seam, _ in CASES)
    for path in (tmp_path / "tree", tmp_path / "tree" / "vllm"):
        with _seamcheck.open_source(path) as source:
            assert _found(_seamcheck.check_source(source, seams)) == CASES


def test_check_at_plugin_load_is_the_static_check_of_the_installed_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One checker: the check at plugin load finds and misses exactly what
    `check-seams` does, in the installed vLLM's source (here, the fake package's)."""
    _write_package(tmp_path / "tree", "vllm")
    monkeypatch.setattr(_seamcheck, "installed_vllm", lambda: tmp_path / "tree" / "vllm")
    assert [(seam, _seamcheck.check_seams((seam,)) == []) for seam, _ in CASES] == CASES
    assert _seamcheck.check_seams((Seam("vllm.base", "Thing", "absent", "instance"),)) == [
        "vllm.base.Thing.absent (Thing.__init__ does not set self.absent; instance attribute set in Thing.__init__)"
    ]


def test_one_seam_checker() -> None:
    """The check at plugin load has no rules of its own: it is `_seamcheck`'s
    (vLLM's source read with `ast`, no `inspect` of vLLM's objects), and the
    seams' table imports nothing to check with."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(_seams))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "inspect" not in imported
    assert "importlib" not in imported
    # The plugin-load check lives with the checker, which reads the seams' table.
    assert not hasattr(_seams, "check_seams")
    assert "check_source(" in inspect.getsource(_seamcheck.check_seams)
    assert "check_seams()" in inspect.getsource(_seamcheck.require_supported_vllm)


def test_both_checks_find_every_seam_in_the_installed_vllm() -> None:
    """`make test`'s check of the installed CPU build, both ways."""
    with _seamcheck.open_source(_seamcheck.installed_vllm()) as source:
        findings = _seamcheck.check_source(source)
        assert source.version == _seams.vllm_version()
    assert [f.seam.qualname for f in findings if f.location is None] == []
    assert _seamcheck.check_seams() == []
    assert len(findings) == len(_seams.REQUIRED)


def test_required_has_no_duplicates() -> None:
    assert len(set(_seams.REQUIRED)) == len(_seams.REQUIRED)


def test_cli_reports_found_and_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wheel = _fake_wheel(tmp_path, drop="reexport.py")
    seams = (Seam("vllm.base", "Thing", "present", "instance"), Seam("vllm.reexport", None, "Thing"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_seams, "REQUIRED", seams)
        assert main(["check-seams", str(wheel)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"vLLM 9.9.9 ({wheel.name}): 1 of 2 seams found",
        "found    vllm.base.Thing.present  vllm/base.py:20",
        "MISSING  vllm.reexport.Thing  (no module vllm.reexport in the source; module-level name)",
    ]


def test_cli_all_found_and_unreadable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_package(tmp_path / "tree", "vllm")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_seams, "REQUIRED", (Seam("vllm.base", None, "function"),))
        assert main(["check-seams", str(tmp_path / "tree")]) == 0
    assert "1 of 1 seams found" in capsys.readouterr().out
    not_a_wheel = tmp_path / "x.whl"
    not_a_wheel.write_text("no zip")
    assert main(["check-seams", str(not_a_wheel)]) == 2
    assert "is not a wheel or zip" in capsys.readouterr().err


def test_async_renderer_leaves_an_overridden_render_alone() -> None:
    """async-renderer mirrors only `PoolingIOProcessor.render`: a processor whose
    class overrides it (vLLM 0.33.0's `TokenEmbedIOProcessor` prepares late
    chunking there) is rendered by its own `render`, never by the renderer directly."""
    from offload_vllm._seams import renderer as renderer_seam
    from vllm.entrypoints.pooling.base.io_processor import PoolingIOProcessor

    calls: list[str] = []

    class Renderer:
        async def render_cmpl_async(self, prompts: list[object], *args: object, **kwargs: object) -> list[object]:
            calls.append("render_cmpl_async")
            return [{"prompt_token_ids": [1]}]

    class OwnRender(PoolingIOProcessor):
        def render(self, render_params: object) -> object:  # type: ignore[override]
            raise AssertionError("not called here")

    params = {
        "prompts": {"prompt": "hi"}, "tok_params": None, "prompt_extras": None, "skip_mm_cache": False,
        "params": "p", "lora_requests": None, "priorities": 0,
    }
    base = PoolingIOProcessor.__new__(PoolingIOProcessor)
    base.renderer = Renderer()  # type: ignore[assignment]
    own = OwnRender.__new__(OwnRender)
    own.renderer = Renderer()  # type: ignore[assignment]
    assert asyncio.run(renderer_seam.render_with_async_renderer(own, params)) is None
    assert calls == []
    rendered = asyncio.run(renderer_seam.render_with_async_renderer(base, params))
    assert rendered == {"prompts": {"prompt_token_ids": [1]}, "params": "p", "lora_requests": None, "priorities": 0}
    assert calls == ["render_cmpl_async"]
