from __future__ import annotations

import json

from accelbench import report
from accelbench.params import VariantParams
from accelbench.results import Skipped
from helpers import trained_summary

ENV = {
    "cpu": {
        "cpu_model": "Test CPU",
        "logical_cpus": 2,
        "torch_default_threads": 2,
        "python": "3.11",
        "torch": "2.x",
        "torchvision": "0.x",
    },
    "cuda": {
        "cuda_available": True,
        "gpu_count": 2,
        "gpu_names": ["NVIDIA H200"] * 2,
        "gpu_memory_gib": 139.8,
        "compute_capability": "9.0",
        "nvidia_driver": "580",
        "torch_cuda_runtime": "13.0",
        "cudnn": 91900,
    },
}


def _spec(**changes) -> report.ReportSpec:
    values = {
        "target_accuracy": 0.99,
        "speedup_baseline": "cpu",
        "scaling_baselines": {"ddp": "gpu", "ddp_bf16": "gpu"},
        "recipe": "batch 512, 10 epochs",
    }
    return report.ReportSpec(**(values | changes))


def test_report_has_speedups_scaling_and_figures(tmp_path) -> None:
    rows = [
        report.Row(
            "cpu", VariantParams(device="cpu"), trained_summary(10.0, device_name="Test CPU")
        ),
        report.Row(
            "gpu",
            VariantParams(device="cuda"),
            trained_summary(0.2, steady_gpu_energy_j_per_epoch=55.0),
        ),
        report.Row(
            "ddp",
            VariantParams(device="cuda", distributed={"nproc_per_node": 2}),
            trained_summary(0.125, world_size=2),
        ),
        report.Row(
            "ddp_bf16",
            VariantParams(device="cuda", precision="bf16", distributed={"nproc_per_node": 2}),
            trained_summary(0.1, world_size=2),
        ),
        report.Row(
            "amp", VariantParams(device="cuda", precision="bf16"), Skipped("no GPU", "cuda")
        ),
    ]
    result = report.write_report(tmp_path, rows, ENV, _spec())
    md = (tmp_path / "comparison.md").read_text()
    assert "| gpu | trained | NVIDIA H200 | fp32 (strict) |" in md
    assert "speedup vs cpu" in md and "50.0×" in md  # 10 s / 0.2 s
    assert "55 J" in md
    assert "| ddp | 2 | 0.125 s | 1.6× | 80% | gpu |" in md  # speedup over gpu, efficiency
    assert "ddp_bf16 differs from gpu in precision: its speedup mixes" in md
    assert "ddp differs" not in md  # same settings as gpu: the ratio is the scaling alone
    assert "Skipped amp: no GPU." in md
    assert "GTX 1080 Ti" in md  # the tutorials' figures
    for figure in ("summary.png", "epoch_times.png", "curves.png"):
        assert f"]({figure})" in md and (tmp_path / figure).stat().st_size > 10_000
    headline = json.loads((tmp_path / "comparison.json").read_text())
    assert headline["gpu"]["speedup_vs_cpu"] == 50.0
    assert result.headline["ddp.speedup_vs_cpu"] == 80.0


def test_baselines_come_from_params_not_from_variant_names(tmp_path) -> None:
    rows = [
        report.Row("cpu", VariantParams(device="cpu"), trained_summary(10.0)),
        report.Row("fast", VariantParams(device="cuda"), trained_summary(0.5)),
        report.Row(
            "ddp", VariantParams(device="cuda", distributed={"nproc_per_node": 2}),
            trained_summary(0.25, world_size=2),
        ),
    ]  # fmt: skip
    spec = _spec(speedup_baseline="fast", scaling_baselines={"ddp": "fast"})
    result = report.write_report(tmp_path, rows, ENV, spec)
    md = (tmp_path / "comparison.md").read_text()
    assert "speedup vs fast" in md and "| ddp | 2 | 0.250 s | 2.0× | 100% | fast |" in md
    assert result.headline["cpu.speedup_vs_fast"] == 0.05


def test_time_to_target_is_read_from_the_epochs() -> None:
    epochs = [
        {"epoch": 1, "train_time_s": 5.0, "test_accuracy": 0.9},
        {"epoch": 2, "train_time_s": 1.0, "test_accuracy": 0.985},
        {"epoch": 3, "train_time_s": 2.0, "test_accuracy": 0.991},
        {"epoch": 4, "train_time_s": 1.5, "test_accuracy": 0.99},
    ]
    assert report.time_to_target(epochs, 0.99) == (8.0, 3)
    assert report.time_to_target(epochs[:2], 0.99) is None
