"""How figures read to a person, and what a training stage prints while it runs.

The report, the MLflow tags and `accelbench runs` share the formatters, so a figure reads the
same in each. The progress is a bar per epoch on a terminal, a line in logs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from accelbench.core.console import log


def fmt_seconds(value: float | None) -> str:
    """A duration: 0.129 s, 12.3 s; "n/a" for None."""
    if value is None:
        return "n/a"
    return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"


def fmt_ratio(value: float) -> str:
    """How many times faster: 148×, 12.3×, 1.87×."""
    return f"{value:,.0f}×" if value >= 100 else f"{value:.1f}×" if value >= 10 else f"{value:.2f}×"


def fmt_interval(
    value: float, lo: float | None, hi: float | None, fmt: Callable[[float], str]
) -> str:
    """`fmt(value)` and, where both ends are given, its 95% interval with the unit written
    once: "0.129 s (0.127–0.131 s)", "12.3× (11.0–13.5×)"; an interval narrower than the
    figure's last digit is left out ("19.5 s", not "19.5 s (19.5–19.5 s)")."""
    text = fmt(value)
    if lo is None or hi is None:
        return text
    low, high = fmt(lo), fmt(hi)
    if low == high == text:
        return text
    unit = high.lstrip("0123456789.,+-")  # " s", "×"
    if unit and low.endswith(unit):
        low = low[: -len(unit)]
    return f"{text} ({low}–{high})"


class EpochProgress:
    """A tqdm bar per epoch on a terminal; one plain line per epoch otherwise (CI logs)."""

    def __init__(self, name: str, epochs: int, steps: int, *, quiet: bool = False) -> None:
        self.name, self.epochs, self.steps, self.quiet = name, epochs, steps, quiet
        self.interactive = sys.stderr.isatty() and not quiet
        self.bar = None
        self.epoch = 0

    def step(self, samples: int) -> None:
        if not self.interactive:
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(
                total=self.steps,
                desc=f"{self.name} epoch {self.epoch + 1}/{self.epochs}",
                unit="batch",
                leave=False,
                file=sys.stderr,
            )
        self.bar.update(1)

    def epoch_done(self, record) -> None:
        self.epoch = record.epoch
        self.close()
        if self.quiet:
            return
        nonfinite = f", {record.nonfinite_steps} NON-FINITE steps" if record.nonfinite_steps else ""
        stopped = f", STOPPED {record.stopped_s:.1f} s: no steady epoch" if record.stopped else ""
        log(
            f"{self.name} epoch {record.epoch}/{self.epochs}: train {record.train_time_s:.3f} s "
            f"({record.samples_per_s:,.0f} samples/s), loss {record.train_loss:.4f}, "
            f"test accuracy {record.test_accuracy:.2%}{nonfinite}{stopped}"
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
