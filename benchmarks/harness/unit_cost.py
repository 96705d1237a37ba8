"""The unit the vLLM adapter's prices are counted in, timed beside the work they price.

Every price in `offload_vllm/_cost.py` is counted in characters of text
tokenized. A calibration suite (`echo-cost`, `render-cost`) times the work a
price stands for and this unit in the same rounds, in a fresh random order
each round, by this thread's CPU clock (`time.thread_time_ns`), so that each
round gives a ratio of the two (paired) and the report a median over rounds
with an order-statistic interval (`stats.median_interval`).

The unit: the all-MiniLM-L6-v2 fast tokenizer, the one the adapter's
constants were first measured with, on prose, one text per call.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from benchmarks.harness import common as _common
from benchmarks.harness import progress, workloads
from benchmarks.harness.models import minilm_dir
from benchmarks.harness.stats import median_interval

#: Prose tokenized for the unit: texts under the model's 512 tokens, as one prompt is.
UNIT_TEXTS, UNIT_WORDS = 16, 300
#: The figure the adapter's image prices were converted at, in µs a character
#: (`_cost.py`'s `IMAGE_COST` and `PIXEL_COST`); the reports show it beside the
#: unit they measure.
MICROSECONDS_PER_UNIT = 0.36


@contextlib.contextmanager
def quiet_imports() -> Iterator[None]:
    """Import vLLM (and torch) inside this: vLLM's import warns (torch
    deprecations), which under pytest's warnings-as-errors would fail a
    smoke run when no vLLM test imported it first."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def tokenize_as_servers_do() -> None:
    """Tokenize as the benchmarks' servers do (`harness/server.py`), without
    the tokenizers library's own threads. Called at the start of a
    measurement, not at import: importing a suite (its tests do) changes
    nothing else's."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def load_tokenizer() -> Any:
    """The all-MiniLM-L6-v2 fast tokenizer, from the packaged model (never downloaded)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_dir()), local_files_only=True)


class Unit:
    """Tokenizing `UNIT_TEXTS` texts of prose of `UNIT_WORDS` words, one text per call."""

    def __init__(self, seed: int) -> None:
        self.tokenizer = load_tokenizer()
        self.texts = workloads.long_texts(UNIT_TEXTS, UNIT_WORDS, seed=seed)
        #: The characters one `tokenize()` tokenizes.
        self.characters = sum(map(len, self.texts))

    def tokenize(self) -> None:
        for text in self.texts:
            self.tokenizer(text)


def cpu_ns_per_call(call: Callable[[], object], repeats: int) -> float:
    """This thread's CPU nanoseconds per call of `call`, over `repeats` calls."""
    start = time.thread_time_ns()
    for _ in range(repeats):
        call()
    return (time.thread_time_ns() - start) / repeats


def timed_rounds(
    calls: Mapping[str, Callable[[], object]], rounds: int, repeats: int, rng: random.Random, label: str
) -> dict[str, list[float]]:
    """`rounds` rounds, each timing every call of `calls` (`cpu_ns_per_call`
    over `repeats` calls) in a fresh random order: per name, its CPU ns per
    call, one value a round."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    with progress.Progress(rounds, label) as bar:
        for _ in range(rounds):
            order = list(calls)
            rng.shuffle(order)
            for name in order:
                samples[name].append(cpu_ns_per_call(calls[name], repeats))
            bar.step()
    return samples


def interval(values: list[float]) -> list[float]:
    """`[median, low, high, coverage]` of `values` (`stats.median_interval`), as the results store it."""
    found = median_interval(values)
    return [found.median, found.low, found.high, found.coverage]


def fmt(stored: list[float], digits: int) -> str:
    """A stored interval as the reports write it: `median [low, high]`."""
    median, low, high, _ = stored
    return f"{median:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def parser(doc: str, suite: str) -> argparse.ArgumentParser:
    """A calibration suite's options: the common ones, and `--rounds`,
    `--repeats` (each at least 1) and `--seed`."""
    p = _common.parser(doc.splitlines()[0], suite)
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    return p


def run(
    p: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str] | None, suite: str,
    measure: Callable[[], dict[str, Any]], summary: Callable[[dict[str, Any]], Any],
    markdown: Callable[[dict[str, Any]], str], **fields: Any,
) -> int:
    """Run a calibration suite whose sizes are decided (`fields`: `rounds`,
    `repeats` and what it reports besides): refuse rounds or repeats below 1
    before anything runs, then `measure()`, summarise, and write
    `SUITE.{json,md}` (`SUITE-smoke.*` in smoke mode) into `args.out`."""
    if fields["rounds"] < 1 or fields["repeats"] < 1:
        p.error("--rounds and --repeats must be at least 1")
    started = time.monotonic()
    result: dict[str, Any] = {
        "command": " ".join([f"python -m benchmarks {suite}", *(argv if argv is not None else sys.argv[1:])]),
        "machine": _common.machine(), **fields, **measure(),
    }
    result["summary"] = summary(result)
    result["wall_s"] = round(time.monotonic() - started, 1)
    _common.write(args.out, f"{suite}-smoke" if args.smoke else suite, result, markdown(result))
    print(f"wrote the results into {args.out}")
    return 0
