"""Medians with distribution-free 95% intervals, for paired benchmark blocks.

The interval for a median comes from order statistics (the sign-test
interval): with n samples, the k-th smallest and k-th largest bound the median
with probability 1 - 2 * P(Binomial(n, 1/2) < k). Nothing is assumed about
the distribution, which on a shared machine is anything but normal. With 5
samples the best available is [min, max] at 93.8%.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Interval:
    median: float
    low: float
    high: float
    #: The interval's actual coverage (order statistics give discrete levels).
    coverage: float
    n: int

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


def median_interval(values: list[float], confidence: float = 0.95) -> Interval:
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    n = len(ordered)
    median = statistics.median(ordered)
    # The largest k (narrowest interval) whose coverage still reaches `confidence`;
    # with too few samples, the whole range and its (lower) coverage. The
    # binomial sum P(Binomial(n, 1/2) < k) is kept exact, in integers, and grown
    # one term per k: summed anew for each k, a result file's lists of
    # thousands of latencies took seconds each.
    whole = 2**n
    term = 1  # comb(n, k - 1)
    below = 1  # sum of comb(n, i) for i < k
    best_k, coverage = 1, 1 - 2 * (below / whole)
    for k in range(2, n // 2 + 1):
        term = term * (n - k + 2) // (k - 1)
        below += term
        level = 1 - 2 * (below / whole)
        if level < confidence:
            break
        best_k, coverage = k, level
    return Interval(median, ordered[best_k - 1], ordered[n - best_k], coverage, n)


def verdict(ratio: Interval, *, higher: str, lower: str) -> str:
    """`higher`/`lower` when the ratio's interval excludes 1, else "no difference"."""
    if ratio.low > 1:
        return higher
    if ratio.high < 1:
        return lower
    return "no difference"


def paired_ratios(rows: list[float], baseline: list[float]) -> list[float]:
    """Per-round ratios row / baseline (rounds where the baseline is 0 are skipped)."""
    return [r / b for r, b in zip(rows, baseline, strict=True) if b]


def target_verdict(low: float, median: float, high: float, bound: float, *, at_least: bool = False) -> str:
    """A target's verdict from an interval: met or missed where the whole interval
    is on one side of `bound`; where it crosses the bound, said plainly (the
    median's side in brackets), so a crossing is never reported as met."""
    good_low, good_high = (low >= bound, high >= bound) if at_least else (high <= bound, low <= bound)
    if good_low:
        return "**met**"
    if not good_high:
        return "**missed**"
    side = "above" if median >= bound else "below"
    return f"**not met by the interval**: it crosses {bound:g} (median {side})"


def fmt(interval: dict[str, float] | Interval | None, digits: int = 2) -> str:
    """`median [low, high]`, the one way a report writes an interval ("–": not measured)."""
    if interval is None:
        return "–"
    i = interval if isinstance(interval, dict) else interval.__dict__
    return f"{i['median']:.{digits}f} [{i['low']:.{digits}f}, {i['high']:.{digits}f}]"
