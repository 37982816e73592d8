"""The report's one figure, summary.png: each variant's steady epoch with its 95% interval and
speedup, beside its test accuracy. Every epoch's figures are dvc.yaml's plots (`make plots`)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter

from accelbench.report.answer import Row, VariantFigures, fmt_speedup, fmt_time

NOTHING = "no variant has a steady epoch: nothing to compare"


def summary_figure(
    rows: list[Row], figures: Mapping[str, VariantFigures], baseline: str | None, gpu: str
) -> Figure:
    """Steady epoch time with its 95% interval (speedup on each bar) beside test accuracy; a
    line saying so where no variant has a steady epoch."""
    fig = Figure(figsize=(11, 4.2))
    trained = [r for r in rows if r.name in figures]
    if not trained:
        fig.text(0.5, 0.5, NOTHING, ha="center", va="center")
        return fig
    time_ax, acc_ax = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    colors = ["#7f7f7f" if r.variant.device == "cpu" else "#1f77b4" for r in trained]
    _time_bars(time_ax, [r.name for r in trained], colors, figures, baseline)
    time_ax.set_title(f"Epoch time on {gpu}" if gpu else "Epoch time")
    _accuracy_bars(acc_ax, trained, colors)
    fig.tight_layout()
    return fig


def _time_bars(
    ax: Axes,
    names: list[str],
    colors: list[str],
    figures: Mapping[str, VariantFigures],
    baseline: str | None,
) -> None:
    steady = [figures[n].steady_epoch for n in names]
    values = [f.value for f in steady]
    upper = [f.hi if f.has_interval else f.value for f in steady]
    lower = [f.lo if f.has_interval else f.value for f in steady]
    errors = [np.subtract(values, lower), np.subtract(upper, values)]
    bars = ax.barh(names, values, color=colors, xerr=errors, capsize=3)
    for bar, name, hi in zip(bars, names, upper, strict=True):
        label = fmt_time(figures[name].steady_epoch)
        if figures[name].speedup is not None and name != baseline:
            label += f"\n{fmt_speedup(figures[name].speedup)} vs {baseline}"
        y = bar.get_y() + bar.get_height() / 2
        ax.annotate(
            label, (hi, y), xytext=(6, 0), textcoords="offset points", va="center", fontsize=8
        )
    low, high = min(values), max(upper)
    log = high / low > 10  # a log axis only where the times span decades
    if log:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.set_xlim(*((low / 2, high * 8) if log else (0.0, high * 1.8)))  # room for the labels
    ax.invert_yaxis()
    scale = "log scale; " if log else ""
    ax.set_xlabel(f"steady-state training time per epoch (s, {scale}95% interval)")


def _accuracy_bars(ax: Axes, trained: list[Row], colors: list[str]) -> None:
    accuracy = [100 * r.test_accuracy for r in trained]
    bars = ax.barh([r.name for r in trained], accuracy, color=colors)
    for bar, value in zip(bars, accuracy, strict=True):
        y = bar.get_y() + bar.get_height() / 2
        ax.text(bar.get_width(), y, f" {value:.2f}%", va="center", fontsize=9)
    ax.set_xlim(min(accuracy) - 1, min(max(accuracy) + 2, 100))  # room for the labels
    ax.invert_yaxis()
    ax.set_yticks([])
    ax.set(xlabel="test accuracy after training (%)", title="Accuracy")
