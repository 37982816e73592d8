"""The no-communication bound on two-GPU strong-scaling efficiency, from run b's single-GPU
epochs: a DDP run at global batch B does each GPU's half of the epoch at batch B/2, so with
a free all-reduce and ranks in step its efficiency would be T1(B) / T1(B/2). Medians of the
steady epochs (2..10) with accelbench's own bootstrap (accelbench.core.spread).

    PYTHONPATH=src python docs/results/2026-12-02-h200-scaling-bound/bound.py
"""

import csv
from pathlib import Path

from accelbench.core.spread import median, ratio_of_medians

SWEEP = Path(__file__).parent / "b" / "sweep"


def steady(batch: int, variant: str) -> list[float] | None:
    path = SWEEP / f"batch{batch}" / "metrics" / variant / "epochs.csv"
    if not path.is_file():
        return None
    with path.open() as f:
        return [float(row["train_time_s"]) for row in csv.DictReader(f)][1:]


def pct(figure) -> str:
    return f"{100 * figure.value:.0f}% ({100 * figure.lo:.0f}–{100 * figure.hi:.0f}%)"


print("| variant | global batch B | T1(B) | T1(B/2) | bound T1(B)/T1(B/2) |")
print("|---|---|---|---|---|")
for variant in ("gpu", "amp"):
    for batch in (512, 1024, 2048, 4096):
        whole, half = steady(batch, variant), steady(batch // 2, variant)
        if whole is None or half is None:
            continue
        a, b = median(whole), median(half)
        times = (f"{x.value:.4f} s ({x.lo:.4f}–{x.hi:.4f})" for x in (a, b))
        print(f"| {variant} | {batch} | {' | '.join(times)} | {pct(ratio_of_medians(whole, half))} |")
