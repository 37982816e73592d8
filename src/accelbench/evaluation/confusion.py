"""The confusion matrix of an evaluated variant: per-class scores from it, a CSV for DVC's plot,
and a figure."""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt
import numpy as np

from accelbench.core.results import ClassScores


def class_scores(counts: np.ndarray) -> dict[str, ClassScores]:
    """Precision, recall and F1 per class from a confusion matrix [actual, predicted], as
    scikit-learn's classification_report defines them (0 where undefined); classes absent
    from both the targets and the predictions are left out."""
    true_positives = np.diag(counts).astype(float)
    predicted = counts.sum(axis=0).astype(float)
    actual = counts.sum(axis=1).astype(float)
    scores = {}
    for c in range(len(counts)):
        if not actual[c] and not predicted[c]:
            continue
        precision = true_positives[c] / predicted[c] if predicted[c] else 0.0
        recall = true_positives[c] / actual[c] if actual[c] else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        scores[str(c)] = ClassScores(float(precision), float(recall), float(f1))
    return scores


def write_confusion_csv(path: Path, pairs: tuple[np.ndarray, np.ndarray] | None) -> None:
    """One row per test sample (actual, predicted): DVC's `confusion` plot template."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["actual", "predicted"])
        if pairs is not None:
            writer.writerows(zip(pairs[0].tolist(), pairs[1].tolist(), strict=True))


def placeholder_figure(path: Path, text: str) -> None:
    fig, ax = plt.subplots(figsize=(5, 2))
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def confusion_figure(path: Path, matrix: np.ndarray, title: str) -> None:
    fig, ax = plt.subplots(figsize=(6, 5.2))
    image = ax.imshow(np.log1p(matrix), cmap="Blues")
    for (i, j), count in np.ndenumerate(matrix):
        color = "white" if i == j else "black"
        ax.text(j, i, str(count), ha="center", va="center", fontsize=7, color=color)
    ax.set(xticks=range(10), yticks=range(10), title=title)
    ax.set(xlabel="predicted digit", ylabel="actual digit")
    fig.colorbar(image, ax=ax, label="log(1 + count)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def matrix(y_true: np.ndarray, y_pred: np.ndarray) -> np.ndarray:
    """Counts [actual digit, predicted digit] over the ten classes."""
    pairs = np.asarray(y_true, dtype=np.int64) * 10 + np.asarray(y_pred, dtype=np.int64)
    return np.bincount(pairs, minlength=100).reshape(10, 10)
