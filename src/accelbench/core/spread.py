"""How sure a timing is: a figure with its 95% interval, from the epochs that measured it.

Every interval is a percentile bootstrap (Efron & Tibshirani, ch. 13) of `RESAMPLES` draws
with replacement from a fixed seed (the same epochs give the same interval); a ratio's
resamples both sides independently, so it carries both variants' spreads.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

RESAMPLES = 10_000
CONFIDENCE = 0.95
SEED = 0
METHOD = (
    f"95% intervals are percentile bootstraps ({RESAMPLES:,} resamples) over the steady epochs "
    "(epochs 2..N of every repeat, less a resumed training's warm-up); a speedup's interval resamples both variants' epochs "
    "independently, so it carries both spreads."
)


@dataclass(frozen=True)
class Figure:
    """A figure and its 95% interval (`lo`, `hi` None where one sample cannot give one)."""

    value: float
    lo: float | None = None
    hi: float | None = None
    samples: int = 1

    @property
    def has_interval(self) -> bool:
        return self.lo is not None and self.hi is not None

    def inverse(self, numerator: float = 1.0) -> Figure:
        """`numerator / self`, its interval's ends swapped (a time's interval -> a rate's)."""
        return Figure(
            numerator / self.value,
            numerator / self.hi if self.hi else None,
            numerator / self.lo if self.lo else None,
            self.samples,
        )

    def fields(self, key: str) -> dict[str, float | None]:
        """`{key: value, key_lo: lo, key_hi: hi}`: flat, for JSON, DVC metrics and MLflow."""
        return {key: self.value, f"{key}_lo": self.lo, f"{key}_hi": self.hi}


def _draws(samples: Sequence[float], seed: int) -> np.ndarray:
    """`RESAMPLES` draws of `samples`, with replacement: one row each."""
    values = np.asarray(samples, dtype=float)
    rng = np.random.default_rng(seed)
    return values[rng.integers(0, len(values), size=(RESAMPLES, len(values)))]


def _bounds(statistics_: np.ndarray) -> tuple[float, float]:
    tail = (1 - CONFIDENCE) / 2 * 100
    lo, hi = np.percentile(statistics_, [tail, 100 - tail])
    return float(lo), float(hi)


def median(samples: Sequence[float]) -> Figure | None:
    """The median and its interval; None without samples."""
    if not samples:
        return None
    value = statistics.median(samples)
    if len(samples) < 2:
        return Figure(value)
    lo, hi = _bounds(np.median(_draws(samples, SEED), axis=1))
    return Figure(value, lo, hi, len(samples))


def ratio_of_medians(numerator: Sequence[float], denominator: Sequence[float]) -> Figure | None:
    """median(numerator) / median(denominator): how many times faster the denominator's epochs
    are. Its interval needs two samples on each side."""
    if not numerator or not denominator:
        return None
    top, bottom = statistics.median(numerator), statistics.median(denominator)
    if bottom <= 0:
        return None
    value = top / bottom
    if len(numerator) < 2 or len(denominator) < 2:
        return Figure(value)
    tops, bottoms = _draws(numerator, SEED), _draws(denominator, SEED + 1)
    lo, hi = _bounds(np.median(tops, axis=1) / np.median(bottoms, axis=1))
    return Figure(value, lo, hi, min(len(numerator), len(denominator)))


def total_after(first: float, measured: Sequence[float]) -> Figure:
    """Time to `len(measured) + 1` epochs in: `first` + the `measured` epochs after it; the
    interval redraws those epochs only (the first, compilation and all, is one measurement)."""
    value = first + sum(measured)
    if len(measured) < 2:
        return Figure(value)
    draws = _draws(measured, SEED)
    lo, hi = _bounds(first + draws.sum(axis=1))
    return Figure(value, lo, hi, len(measured))
