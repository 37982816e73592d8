from __future__ import annotations

import json

from accelbench import report
from accelbench.params import TrainParams, VariantParams

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


def _trained(steady: float, **extra) -> dict:
    return {
        "status": "trained",
        "epochs": 3,
        "first_epoch_s": 2 * steady,
        "steady_epoch_s": steady,
        "total_train_s": 4 * steady,
        "steady_samples_per_s": 60000 / steady,
        "final_test_accuracy": 0.99,
        "time_to_target_s": None,
        "epoch_to_target": None,
        "device_name": "NVIDIA H200",
        **extra,
    }


def test_report_has_speedups_scaling_and_figures(tmp_path) -> None:
    rows = [
        report.Row("cpu", VariantParams(device="cpu"), _trained(10.0, device_name="Test CPU"), {}),
        report.Row(
            "gpu",
            VariantParams(device="cuda"),
            _trained(0.2, steady_gpu_energy_j_per_epoch=55.0),
            {},
        ),
        report.Row(
            "ddp",
            VariantParams(device="cuda", distributed={"nproc_per_node": 2}),
            _trained(0.125, world_size=2),
            {},
        ),
        report.Row(
            "ddp_bf16",
            VariantParams(device="cuda", precision="bf16", distributed={"nproc_per_node": 2}),
            _trained(0.1, world_size=2),
            {},
        ),
        report.Row(
            "amp",
            VariantParams(device="cuda", precision="bf16"),
            {"status": "skipped", "reason": "no GPU"},
            {},
        ),
    ]
    result = report.write_report(tmp_path, rows, ENV, TrainParams())
    md = (tmp_path / "comparison.md").read_text()
    assert "| gpu | trained | NVIDIA H200 | fp32 (strict) |" in md
    assert "50.0×" in md  # 10 s / 0.2 s
    assert "55 J" in md
    assert "| ddp | 2 | 0.125 s | 1.6× | 80% |" in md  # speedup over gpu, efficiency
    assert "ddp_bf16 differs from gpu in precision: its speedup mixes" in md
    assert "ddp differs" not in md  # same settings as gpu: the ratio is the scaling alone
    assert "Skipped amp: no GPU." in md
    assert "GTX 1080 Ti" in md  # the tutorials' figures
    for figure in ("summary.png", "epoch_times.png", "curves.png"):
        assert f"]({figure})" in md and (tmp_path / figure).stat().st_size > 10_000
    headline = json.loads((tmp_path / "comparison.json").read_text())
    assert headline["gpu"]["speedup_vs_cpu"] == 50.0
    assert result.headline["ddp.speedup_vs_cpu"] == 80.0
