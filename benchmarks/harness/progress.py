"""Progress of a suite's run, with an estimate of the time left.

On a terminal it is a tqdm bar on stderr; anywhere else (CI, a pipe, the
smoke tests) a plain line after the first step, the last, and at most one
every `LINE_EVERY_S` between, since a bar redrawn with carriage returns
turns a log into noise. The estimate is tqdm's: the time per step so
far times the steps left, so it settles after the first few steps (a suite's
server start-up is a phase of its own, `phase`, not a step).
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import IO, Any

from tqdm import tqdm  # type: ignore[import-untyped, unused-ignore]
from typing_extensions import Self

#: Away from a terminal, the least seconds between two progress lines.
LINE_EVERY_S = 10.0


def _interactive(stream: IO[str]) -> bool:
    return bool(getattr(stream, "isatty", lambda: False)())


class Progress:
    """`total` steps of one run, counted with `step()`; a context manager."""

    def __init__(self, total: int, desc: str, *, stream: IO[str] | None = None) -> None:
        self.total = total
        self.desc = desc
        self._stream = stream or sys.stderr
        self._done = 0
        self._started = time.monotonic()
        self._last_line = float("-inf")
        self._bar: Any = (
            tqdm(total=total, desc=desc, file=self._stream, unit="step", dynamic_ncols=True)
            if _interactive(self._stream)
            else None
        )

    def step(self, what: str = "") -> None:
        """One step done; `what` names it (shown beside the count)."""
        self._done += 1
        if self._bar is not None:
            self._bar.set_postfix_str(what, refresh=False)
            self._bar.update(1)
            return
        now = time.monotonic()
        if self._done not in (1, self.total) and now - self._last_line < LINE_EVERY_S:
            return
        self._last_line = now
        elapsed = now - self._started
        left = elapsed / self._done * max(self.total - self._done, 0)
        print(
            f"[{self.desc}] {self._done}/{self.total}{f' {what}' if what else ''}: "
            f"{tqdm.format_interval(elapsed)} elapsed, about {tqdm.format_interval(left)} left",
            file=self._stream, flush=True,
        )

    def note(self, text: str) -> None:
        """A line of the run's own output, printed without breaking the bar."""
        if self._bar is not None:
            self._bar.write(text, file=self._stream)
        else:
            print(text, file=self._stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@contextmanager
def phase(what: str, expected_s: float | None = None, *, stream: IO[str] | None = None) -> Iterator[None]:
    """A step without a count (starting servers): says what and for about how
    long before, and how long it took after."""
    out = stream or sys.stderr
    expected = f" (about {tqdm.format_interval(expected_s)})" if expected_s else ""
    print(f"{what}{expected}...", file=out, flush=True)
    began = time.monotonic()
    yield
    print(f"{what}: done in {tqdm.format_interval(time.monotonic() - began)}", file=out, flush=True)


def interleaved(rows: list[str], rounds: int, seed: int, desc: str) -> Iterator[tuple[int, str, Progress]]:
    """Every row once a round, in a fresh random order each round (drawn from
    `seed`), so that a shared machine's drift falls on every row alike:
    `(round, row, bar)`, the bar stepped once the caller is done with each."""
    shuffle = random.Random(seed)
    with Progress(rounds * len(rows), desc) as bar:
        for number in range(rounds):
            order = list(rows)
            shuffle.shuffle(order)
            for row in order:
                yield number, row, bar
                bar.step(f"round {number + 1} {row}")
