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

import contextlib
import random
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

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
