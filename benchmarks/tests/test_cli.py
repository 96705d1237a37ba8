"""`python -m benchmarks`: the listing, a suite's run with its progress and its answer."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import cli
from benchmarks.harness import common, progress
from benchmarks.registry import SUITES

ROOT = Path(__file__).resolve().parents[2]


def test_the_listing_names_every_suite_with_its_question_command_minutes_and_output() -> None:
    text = cli.listing()
    for suite in SUITES:
        assert suite.question in text
        assert f"python -m benchmarks {suite.name}  (~{suite.minutes:g} min on {suite.measured_on}" in text
        assert f"writes {suite.output}" in text


def test_every_suite_module_exists_and_has_a_main() -> None:
    for suite in SUITES:
        path = ROOT / (suite.module.replace(".", "/") + ".py")
        assert "\ndef main(" in path.read_text(), suite.name


def test_an_unknown_suite_is_refused_with_the_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["nope"]) == 2
    err = capsys.readouterr().err
    assert "no suite 'nope'" in err
    assert "paired" in err
    assert "compare" in err


def test_the_answer_is_the_targets_then_the_tables() -> None:
    report = ("# title\n\n<!-- --8<-- [start:meta] -->\nmeta\n<!-- --8<-- [end:meta] -->\n"
              "<!-- --8<-- [start:tables] -->\n| a |\n<!-- --8<-- [end:tables] -->\n"
              "<!-- --8<-- [start:targets] -->\n- met\n<!-- --8<-- [end:targets] -->\n")
    assert cli.answer(report) == "- met\n\n| a |"


def test_a_suite_run_prints_progress_then_its_answer_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under pytest stderr is no terminal: progress comes as plain lines with the time left."""
    assert cli.main(["overhead", "--smoke", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert re.search(r"\[overhead rounds\] 1/\d+ .*elapsed, about \d\d:\d\d left", err), err
    assert "\r" not in err
    answer = out[out.index("== overhead: answer"):]
    assert answer.index("| contender | µs / call") < answer.index("Whole report:")


def test_progress_draws_a_bar_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    with progress.Progress(2, "steps", stream=stream) as bar:
        bar.step("one")
        bar.note("a line of output")
        bar.step("two")
    text = stream.getvalue()
    assert "\r" in text
    assert "2/2" in text
    assert "a line of output" in text


def test_progress_away_from_a_terminal_writes_a_line_per_reported_step() -> None:
    stream = io.StringIO()
    with progress.Progress(3, "steps", stream=stream) as bar:
        for _ in range(3):
            bar.step()
    lines = stream.getvalue().splitlines()
    # The first and the last always; the middle one only LINE_EVERY_S after the first.
    assert [line.split(":")[0] for line in lines] == ["[steps] 1/3", "[steps] 3/3"]
    assert lines[-1].endswith("about 00:00 left")


def test_the_benchmarks_page_names_every_suite() -> None:
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    table = page[page.index("## Run a suite"):page.index("## Headline results")]
    assert [s.name for s in SUITES if f"`{s.name}`" not in table] == []


def test_every_benchmark_command_in_the_docs_names_a_suite_or_command_that_exists() -> None:
    # The docs quote the commands behind their figures; a renamed suite or an
    # old per-suite module (`python -m benchmarks.bench_overload`) left there
    # would send a reader to a command that no longer runs.
    known = {s.name for s in SUITES} | {"compare", "plots", "SUITE", "NAME"}
    stale: list[str] = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = path.read_text()
        if path.parent.name == "decisions" and re.search(r"git checkout [0-9a-f]{7,40} && python -m benchmarks", text):
            # A decision record that reruns its experiment from git names the
            # suites as they were at that commit.
            continue
        if path.name == "index.md" and path.parent.name == "decisions":
            # It says what the commands were called before the one entry point.
            text = text.replace("python -m benchmarks.bench_SUITE", "")
        stale += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in re.finditer(r"python -m benchmarks\.\w+", text)]
        for m in re.finditer(r"python -m benchmarks ([\w-]+)", text):
            name = m.group(1)
            if name not in known and not name.startswith("-"):
                stale.append(f"{path.relative_to(ROOT)}: {m.group(0)}")
    assert stale == []


def _git_status() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout


@pytest.mark.timeout(300)
def test_a_suite_run_as_the_readme_says_leaves_git_status_unchanged() -> None:
    """`python -m benchmarks overhead` with its default output writes outside
    the tracked tree (the docs' snapshot changes only by `--out`)."""
    before = _git_status()
    started = time.time()
    subprocess.run([sys.executable, "-m", "benchmarks", "overhead", "--smoke"], cwd=ROOT, check=True,
                   capture_output=True, timeout=280)
    assert _git_status() == before
    written = common.RESULTS / "overhead" / "overhead.json"
    assert written.stat().st_mtime >= started - 1


def test_no_suite_writes_into_the_snapshot_by_default() -> None:
    for suite in SUITES:
        source = (ROOT / (suite.module.replace(".", "/") + ".py")).read_text()
        assert "SNAPSHOT" not in source, suite.name
        assert "results/latest" not in source, suite.name


def test_the_models_builder_takes_help_without_building_anything(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.harness import models

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        models.main(["--help"])
    assert exit_.value.code == 0
    assert list(tmp_path.iterdir()) == []


def test_every_suite_module_imports_without_its_optional_modules() -> None:
    # A suite importing another that left the tree fails only when someone runs
    # it; its optional modules (`requires`) are imported inside its functions.
    import importlib

    for suite in SUITES:
        importlib.import_module(suite.module)
