"""The benchmarks page's decision table and pictures cannot drift from the committed results.

`benchmarks/harness/plots.py` makes them from `benchmarks/results/latest/**`; these tests
make them again, from the committed results, and compare with what is
committed (a result rerun without `python -m benchmarks.plots` fails here).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from benchmarks.harness import plots, stats

FIGURE = re.compile(r"(\d+\.\d+) \[(\d+\.\d+), (\d+\.\d+)\]")


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("plots")
    plots.write(out, out)
    return out


@pytest.mark.parametrize("name", ["decision.md", "headlines.md"])
def test_the_tables_are_the_ones_the_committed_results_give(regenerated: Path, name: str) -> None:
    committed = (plots.RESULTS / name).read_text()
    assert (regenerated / name).read_text() == committed, (
        f"benchmarks/results/latest/{name} is stale: run `python -m benchmarks plots`"
    )


@pytest.mark.parametrize("name", list(plots.PICTURES))
def test_the_pictures_are_the_ones_the_committed_results_give(regenerated: Path, name: str) -> None:
    import matplotlib

    committed = (plots.IMG / name).read_text()
    made_by = re.search(r"Matplotlib v([\w.]+)", committed)
    assert made_by is not None, f"docs/img/{name} was not made by benchmarks/harness/plots.py"
    if made_by.group(1) != matplotlib.__version__:
        pytest.skip(f"docs/img/{name} was drawn by matplotlib {made_by.group(1)}, this is {matplotlib.__version__}")
    assert (regenerated / name).read_text() == committed, (
        f"docs/img/{name} is stale: run `python -m benchmarks plots`"
    )


def _intervals(node: Any) -> set[str]:
    """Every `median [low, high]` in a results file, as the table writes it: the
    stored intervals, and those of the stored lists of per-round values."""
    found: set[str] = set()
    if isinstance(node, dict):
        if {"median", "low", "high"} <= node.keys():
            found.add(plots.fmt(node, unit=""))
        for value in node.values():
            found |= _intervals(value)
    elif isinstance(node, list):
        if len(node) > 1 and all(isinstance(v, float) for v in node):
            found.add(plots.fmt(stats.median_interval(node).__dict__, unit=""))
        for value in node:
            found |= _intervals(value)
    return found


@pytest.mark.parametrize("name", ["decision.md", "headlines.md"])
def test_every_figure_in_the_tables_is_in_the_results(name: str) -> None:
    known: set[str] = set()
    for path in plots.RESULTS.rglob("*.json"):
        known |= _intervals(json.loads(path.read_text()))
    table = (plots.RESULTS / name).read_text()
    figures = [m.group(0) for m in FIGURE.finditer(table)]
    assert len(figures) >= 10
    assert [f for f in figures if f not in known] == []


def test_the_page_includes_the_table_and_the_pictures() -> None:
    page = (plots.ROOT / "docs" / "benchmarks.md").read_text()
    top = page[: page.index("\n## ")]  # before the first section: what a reader sees first
    assert '--8<-- "benchmarks/results/latest/decision.md:table"' in top
    assert "img/small_under_flood.svg" in top
    assert "img/api_cpu.svg" in top
