"""`python -m benchmarks`: the suites, one entry point.

    python -m benchmarks                      # list the suites: question, command, minutes, output
    python -m benchmarks SUITE [ARGS...]      # run one (ARGS: the suite's own, see SUITE --help)
    python -m benchmarks compare [--smoke]    # rerun the steady figures, compare with the snapshot
    python -m benchmarks plots                # remake the decision table and pictures from the snapshot (benchmarks/results/latest)

A suite shows its progress on stderr (a bar on a terminal, a line per step
elsewhere) and ends by printing its answer: the report's tables, then where
the whole report is.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import time
from pathlib import Path

from benchmarks.harness import common
from benchmarks.registry import BY_NAME, SUITES, Suite

_SECTION = re.compile(r"<!-- --8<-- \[start:(\w+)\] -->\n(.*?)<!-- --8<-- \[end:\1\] -->\n", re.DOTALL)
#: The report sections that hold a suite's answer, in the order printed.
ANSWER_SECTIONS = ("targets", "table", "tables")


def _shown(path: Path) -> Path:
    return path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path


def listing() -> str:
    """Every suite: its question, command, expected minutes on 2 cores and output."""
    lines = [
        "Suites (python -m benchmarks SUITE [--smoke] [--out DIR] [suite options; SUITE --help]).",
        f"Results go to {_shown(common.RESULTS)}/SUITE/ (ignored by git) unless --out says otherwise;",
        f"the docs quote the snapshot in {_shown(common.SNAPSHOT)}/, updated only by --out naming it.",
        "",
    ]
    for suite in SUITES:
        missing = [m for m in suite.requires if importlib.util.find_spec(m) is None]
        notes = [f"~{suite.minutes:g} min on {suite.measured_on}"]
        if suite.vllm:
            notes.append("starts vLLM servers")
        if missing:
            notes.append(f"needs {', '.join(missing)}: not installed here")
        lines += [
            f"  {suite.name:<13} {suite.question}",
            f"  {'':<13} {suite.command}  ({'; '.join(notes)})",
            f"  {'':<13} writes {suite.output}",
        ]
    lines.append("")
    lines.append("Also: `python -m benchmarks compare` (regression check), `python -m benchmarks plots`.")
    return "\n".join(lines)


def answer(report: str) -> str:
    """A report's answer: its targets and tables, in that order, without the markers."""
    sections = dict(_SECTION.findall(report))
    parts = [sections[name].strip() for name in ANSWER_SECTIONS if name in sections]
    return "\n\n".join(parts) if parts else report.strip()


def _out_dir(suite: Suite, args: list[str]) -> Path:
    for i, arg in enumerate(args):
        if arg == "--out" and i + 1 < len(args):
            return Path(args[i + 1])
        if arg.startswith("--out="):
            return Path(arg.split("=", 1)[1])
    return common.RESULTS / suite.name


def run(suite: Suite, args: list[str]) -> int:
    """Run one suite, then print the answer of every report it wrote."""
    missing = [m for m in suite.requires if importlib.util.find_spec(m) is None]
    if missing:
        print(f"{suite.name} needs {', '.join(missing)}, not installed here", file=sys.stderr)
        return 2
    if "-h" not in args and "--help" not in args:
        print(f"{suite.name}: {suite.question}\nabout {suite.minutes:g} min on {suite.measured_on} (with the "
              "default arguments); progress on stderr", file=sys.stderr, flush=True)
    began = time.time()
    module = importlib.import_module(suite.module)
    status: int = module.main(args)
    out = _out_dir(suite, args)
    written = sorted(p for p in out.glob("*.md") if p.stat().st_mtime >= began - 1) if out.is_dir() else []
    for path in written:
        print(f"\n== {suite.name}: answer ({path}) ==\n")
        print(answer(path.read_text()))
    if written:
        print(f"\nWhole report{'s' if len(written) > 1 else ''}: {', '.join(map(str, written))}")
    return status


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("list", "-h", "--help"):
        print(listing())
        return 0
    name, rest = args[0], args[1:]
    if name == "compare":
        from benchmarks import compare

        return compare.main(rest)
    if name == "plots":
        from benchmarks.harness import plots

        return plots.main(rest)
    suite = BY_NAME.get(name)
    if suite is None:
        print(f"no suite {name!r}; the suites: {', '.join(BY_NAME)} (and compare, plots)", file=sys.stderr)
        return 2
    return run(suite, rest)
