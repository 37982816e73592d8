"""The comparison: a Markdown table, figures, and the progress lines printed while training."""

from __future__ import annotations

import csv
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt
import numpy as np

from .params import TrainParams, VariantParams

# Published figures of the tutorials this project grew from (seed CNN, batch 512).
TUTORIAL_FIGURES = [
    {"source": "tutorial A", "hardware": "CPU (unnamed)", "epoch_s": 82.3, "accuracy": 0.9785},
    {"source": "tutorial A", "hardware": "GTX 1080 Ti", "epoch_s": 3.9, "accuracy": 0.980},
    {"source": "tutorial B", "hardware": "i7-12700K", "epoch_s": 58.7, "accuracy": 0.982},
    {"source": "tutorial B", "hardware": "RTX 4090", "epoch_s": 5.2, "accuracy": 0.984},
]


def fmt_seconds(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"


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
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if not self.quiet:
            print(
                f"{self.name} epoch {record.epoch}/{self.epochs}: train {record.train_time_s:.3f} s "
                f"({record.samples_per_s:,.0f} samples/s), loss {record.train_loss:.4f}, "
                f"test accuracy {record.test_accuracy:.2%}"
                + (
                    f", {record.nonfinite_steps} NON-FINITE steps" if record.nonfinite_steps else ""
                ),
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


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
        ax.text(
            j,
            i,
            str(count),
            ha="center",
            va="center",
            fontsize=7,
            color="white" if i == j else "black",
        )
    ax.set(
        xticks=range(10),
        yticks=range(10),
        xlabel="predicted digit",
        ylabel="actual digit",
        title=title,
    )
    fig.colorbar(image, ax=ax, label="log(1 + count)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def read_epochs_csv(path: Path) -> list[dict[str, float]]:
    with path.open() as handle:
        return [
            {k: float(v) if v not in ("", "None") else float("nan") for k, v in row.items()}
            for row in csv.DictReader(handle)
        ]


@dataclass
class Row:
    name: str
    variant: VariantParams
    train: dict[str, Any]
    eval: dict[str, Any]
    epochs: list[dict[str, float]] = field(default_factory=list)

    @property
    def trained(self) -> bool:
        return self.train.get("status") == "trained"


@dataclass
class ReportResult:
    files: list[Path]
    headline: dict[str, Any]


def _speedups(rows: list[Row]) -> dict[str, float | None]:
    baseline = next((r for r in rows if r.name == "cpu" and r.trained), None)
    if baseline is None:
        baseline = next((r for r in rows if r.variant.device == "cpu" and r.trained), None)
    base = baseline.train.get("steady_epoch_s") if baseline else None
    out: dict[str, float | None] = {}
    for row in rows:
        steady = row.train.get("steady_epoch_s") if row.trained else None
        out[row.name] = base / steady if base and steady else None
    return out


def _cell(value: Any, kind: str) -> str:
    if value is None:
        return "n/a"
    return {
        "s": fmt_seconds(value),
        "x": f"{value:.1f}×" if isinstance(value, float) else str(value),
        "pct": f"{value:.2%}",
        "pct0": f"{value:.0%}",
        "int": f"{value:,.0f}",
        "mib": f"{value:,.0f} MiB",
        "j": f"{value:,.0f} J",
    }[kind]


def _precision(variant: VariantParams) -> str:
    if variant.precision == "fp32" and variant.device == "cuda":
        return "fp32 (TF32 matmul)" if variant.tf32 else "fp32 (strict)"
    return variant.precision


def _tflops(train: dict[str, Any]) -> str:
    achieved = train.get("steady_tflops")
    if achieved is None:
        return "n/a"
    share = train.get("peak_share")
    return f"{achieved:.2f} ({share:.1%})" if share is not None else f"{achieved:.2f}"


def _table(rows: list[Row], speedups: dict[str, float | None], target: float) -> list[str]:
    head = [
        "variant",
        "status",
        "device",
        "precision",
        "batches",
        "epochs",
        "first epoch",
        "steady epoch (median)",
        "total train",
        "samples/s (steady)",
        "speedup vs cpu",
        "data wait",
        "TFLOP/s (share of peak)",
        "peak host RSS",
        "peak GPU mem",
        "GPU energy / epoch",
        "test accuracy",
        f"time to {target:.1%}",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        t = row.train
        if not row.trained:
            cells = [
                row.name,
                t.get("status", "missing"),
                row.variant.device,
                row.variant.precision,
                row.variant.batches,
            ] + ["n/a"] * (len(head) - 5)
        else:
            reached = t.get("time_to_target_s")
            cells = [
                row.name,
                "trained",
                t.get("device_name", row.variant.device),
                _precision(row.variant),
                row.variant.batches,
                str(t["epochs"]),
                _cell(t["first_epoch_s"], "s"),
                _cell(t["steady_epoch_s"], "s"),
                _cell(t["total_train_s"], "s"),
                _cell(t["steady_samples_per_s"], "int"),
                _cell(speedups[row.name], "x"),
                _cell(t.get("data_wait_fraction"), "pct0"),
                _tflops(t),
                _cell(t.get("peak_host_rss_mib"), "mib"),
                _cell(t.get("peak_gpu_mem_mib"), "mib"),
                _cell(t.get("steady_gpu_energy_j_per_epoch"), "j"),
                _cell(row.eval.get("test_accuracy", t["final_test_accuracy"]), "pct"),
                (
                    f"{fmt_seconds(reached)} (epoch {t['epoch_to_target']})"
                    if reached is not None
                    else "not reached"
                ),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    reasons: dict[str, list[str]] = {}
    for row in rows:
        if not row.trained:
            reasons.setdefault(row.train.get("reason", "no reason recorded"), []).append(row.name)
    for reason, names in reasons.items():
        lines += ["", f"Skipped {', '.join(names)}: {reason}."]
    return lines


def _scaling_lines(rows: list[Row]) -> list[str]:
    """DDP rows: speedup over the single-GPU `gpu` variant and scaling efficiency."""
    base = next((r for r in rows if r.name == "gpu" and r.trained), None)
    distributed = [r for r in rows if r.variant.distributed is not None and r.trained]
    if not distributed:
        return []
    lines = [
        "## Scaling (DistributedDataParallel)",
        "",
        "| variant | processes | steady epoch | speedup vs gpu | scaling efficiency |",
        "|---|---|---|---|---|",
    ]
    notes = []
    for row in distributed:
        world = row.train.get("world_size", 1)
        steady = row.train.get("steady_epoch_s")
        speedup = base.train["steady_epoch_s"] / steady if base and steady else None
        lines.append(
            f"| {row.name} | {world} | {fmt_seconds(steady)} | {_cell(speedup, 'x')} | "
            f"{_cell(speedup / world if speedup else None, 'pct0')} |"
        )
        differing = settings_differing(row.variant, base.variant) if base else []
        if differing:
            notes.append(
                f"{row.name} differs from gpu in {', '.join(differing)}: its speedup mixes "
                "those settings' effect with the scaling."
            )
    return [
        *lines,
        "",
        "Scaling efficiency = speedup / processes, at the same global batch "
        "(each process takes batch / processes).",
        *notes,
        "",
    ]


def settings_differing(variant: VariantParams, base: VariantParams) -> list[str]:
    """Settings (other than `distributed`) in which two variants differ."""
    ours, theirs = variant.model_dump(), base.model_dump()
    return [k for k in ours if k != "distributed" and ours[k] != theirs[k]]


def _curves_figure(path: Path, rows: list[Row], target: float) -> None:
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for row in rows:
        if not row.trained or not row.epochs:
            continue
        epochs = [e["epoch"] for e in row.epochs]
        loss_ax.plot(epochs, [e["train_loss"] for e in row.epochs], marker="o", label=row.name)
        acc_ax.plot(
            epochs, [100 * e["test_accuracy"] for e in row.epochs], marker="o", label=row.name
        )
    acc_ax.axhline(
        100 * target, color="grey", linestyle="--", linewidth=1, label=f"{target:.0%} target"
    )
    loss_ax.set(
        xlabel="epoch", ylabel="training loss (cross-entropy)", title="Training loss", yscale="log"
    )
    acc_ax.set(xlabel="epoch", ylabel="test accuracy (%)", title="Test accuracy")
    for ax in (loss_ax, acc_ax):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _epoch_times_figure(path: Path, rows: list[Row], speedups: dict[str, float | None]) -> None:
    trained = [r for r in rows if r.trained]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    if not trained:
        ax.text(0.5, 0.5, "no variant trained", ha="center", va="center")
    else:
        x = np.arange(len(trained))
        first = [r.train["first_epoch_s"] for r in trained]
        steady = [r.train["steady_epoch_s"] or r.train["first_epoch_s"] for r in trained]
        ax.bar(x - 0.2, first, width=0.4, label="first epoch", color="#bbbbbb")
        bars = ax.bar(x + 0.2, steady, width=0.4, label="steady epoch (median)", color="#1f77b4")
        for bar, row in zip(bars, trained, strict=True):
            label = f"{fmt_seconds(bar.get_height())}"
            if speedups.get(row.name):
                label += f"\n{speedups[row.name]:.1f}×"
            ax.annotate(
                label,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        for ref in TUTORIAL_FIGURES[1::2]:
            ax.axhline(ref["epoch_s"], linestyle=":", color="#d62728", linewidth=1)
            ax.annotate(
                f"tutorial: {ref['hardware']} {ref['epoch_s']} s",
                (len(trained) - 0.5, ref["epoch_s"]),
                ha="right",
                va="bottom",
                fontsize=7,
                color="#d62728",
            )
        ax.set_xticks(
            x, [f"{r.name}\n{r.train.get('device_name', '')[:28]}" for r in trained], fontsize=8
        )
        ax.set_yscale("log")
        ax.set_ylabel("training time per epoch (s, log scale)")
        ax.legend(loc="upper right", fontsize=8)
    ax.set_title("Epoch time (training only, synchronized clocks)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _summary_figure(
    path: Path, rows: list[Row], speedups: dict[str, float | None], gpu: str
) -> None:
    """One slide: steady epoch time (log axis, speedup on each bar) beside test accuracy."""
    trained = [r for r in rows if r.trained and r.train.get("steady_epoch_s")]
    fig, (time_ax, acc_ax) = plt.subplots(
        1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]}
    )
    names = [r.name for r in trained]
    colors = ["#7f7f7f" if r.variant.device == "cpu" else "#1f77b4" for r in trained]
    steady = [r.train["steady_epoch_s"] for r in trained]
    bars = time_ax.barh(names, steady, color=colors)
    for bar, row in zip(bars, trained, strict=True):
        label = f" {fmt_seconds(bar.get_width())}"
        if speedups.get(row.name):
            label += (
                f"  ({speedups[row.name]:.0f}× cpu)"
                if speedups[row.name] >= 10
                else (f"  ({speedups[row.name]:.1f}× cpu)")
            )
        time_ax.text(
            bar.get_width(), bar.get_y() + bar.get_height() / 2, label, va="center", fontsize=9
        )
    time_ax.set_xscale("log")
    time_ax.set_xlim(min(steady, default=0.01) / 2, max(steady, default=1) * 20)
    time_ax.invert_yaxis()
    time_ax.set_xlabel("steady-state training time per epoch (s, log scale)")
    time_ax.set_title(f"Epoch time on {gpu}" if gpu else "Epoch time")
    accuracy = [100 * r.eval.get("test_accuracy", r.train["final_test_accuracy"]) for r in trained]
    acc_bars = acc_ax.barh(names, accuracy, color=colors)
    for bar, value in zip(acc_bars, accuracy, strict=True):
        acc_ax.text(
            bar.get_width(),
            bar.get_y() + bar.get_height() / 2,
            f" {value:.2f}%",
            va="center",
            fontsize=9,
        )
    acc_ax.set_xlim(min(accuracy, default=97) - 1, 100)
    acc_ax.invert_yaxis()
    acc_ax.set_yticks([])
    acc_ax.set_xlabel("test accuracy after training (%)")
    acc_ax.set_title("Accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _env_lines(env: dict[str, dict[str, Any]]) -> list[str]:
    cpu, gpu = env["cpu"], env["cuda"]
    lines = [
        f"- CPU: {cpu['cpu_model']}, {cpu['logical_cpus']} logical CPUs "
        f"(torch uses {cpu['torch_default_threads']} threads by default)",
        f"- Software: Python {cpu['python']}, torch {cpu['torch']}, torchvision {cpu['torchvision']}",
    ]
    if gpu.get("cuda_available"):
        lines.append(
            f"- GPU: {gpu['gpu_count']} × {gpu['gpu_names'][0]} ({gpu['gpu_memory_gib']} GiB, "
            f"compute capability {gpu['compute_capability']}), NVIDIA driver {gpu['nvidia_driver']}, "
            f"CUDA runtime {gpu['torch_cuda_runtime']}, cuDNN {gpu['cudnn']}"
        )
    else:
        lines.append(f"- GPU: none usable ({gpu.get('reason')})")
    return lines


def write_report(
    out_dir: Path, rows: list[Row], env: dict[str, dict[str, Any]], train: TrainParams
) -> ReportResult:
    out_dir.mkdir(parents=True, exist_ok=True)
    speedups = _speedups(rows)
    curves, times = out_dir / "curves.png", out_dir / "epoch_times.png"
    summary = out_dir / "summary.png"
    _curves_figure(curves, rows, train.target_accuracy)
    _epoch_times_figure(times, rows, speedups)
    gpu = env["cuda"]["gpu_names"][0] if env["cuda"].get("cuda_available") else ""
    _summary_figure(summary, rows, speedups, gpu)
    flops = next((r.train.get("flops_per_sample") for r in rows if r.trained), None)
    md = [
        "# accelbench comparison",
        "",
        "Same model, data order, seed and hyperparameters for every variant; only what the variant",
        "names differs. Epoch times are training only (evaluation excluded), read from clocks after a",
        "device synchronize; *steady* is the median of epochs 2..N, the first epoch (warm-up,",
        "autotuning, compilation) is shown apart.",
        "",
        *_env_lines(env),
        f"- Recipe: batch {train.batch_size}, {train.epochs} epochs, Adam lr {train.lr:g}, "
        f"schedule {train.schedule}, seed {train.seed}"
        + (f", training subset {train.train_subset}" if train.train_subset else "")
        + (f", test subset {train.test_subset}" if train.test_subset else ""),
        "",
        *_table(rows, speedups, train.target_accuracy),
        "",
        *_scaling_lines(rows),
        "![summary: epoch time and accuracy per variant](summary.png)",
        "",
        "![epoch times](epoch_times.png)",
        "",
        "![loss and accuracy curves](curves.png)",
        "",
    ]
    if flops:
        md += [
            f"Training FLOPs per sample (forward + backward, counted by `torch.utils.flop_counter`): "
            f"{flops / 1e6:.1f} MFLOP.",
            "",
        ]
    md += [
        "## The tutorials' published figures (for reference, other hardware)",
        "",
        "| source | hardware | epoch | test accuracy |",
        "|---|---|---|---|",
        *[
            f"| {f['source']} | {f['hardware']} | {f['epoch_s']} s | {f['accuracy']:.2%} |"
            for f in TUTORIAL_FIGURES
        ],
        "",
    ]
    (out_dir / "comparison.md").write_text("\n".join(md))
    headline = {
        row.name: {
            "status": row.train.get("status"),
            "steady_epoch_s": row.train.get("steady_epoch_s"),
            "speedup_vs_cpu": speedups[row.name],
            "test_accuracy": row.eval.get("test_accuracy"),
            "time_to_target_s": row.train.get("time_to_target_s"),
        }
        for row in rows
    }
    (out_dir / "comparison.json").write_text(json.dumps(headline, indent=2, sort_keys=True) + "\n")
    flat = {
        f"{name}.{key}": value
        for name, values in headline.items()
        for key, value in values.items()
        if isinstance(value, int | float)
    }
    return ReportResult(
        files=[out_dir / "comparison.md", summary, curves, times, out_dir / "comparison.json"],
        headline=flat,
    )
