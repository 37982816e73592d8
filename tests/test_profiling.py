"""The --profile option: a torch.profiler window after epoch 1, and the trace's step summary."""

from __future__ import annotations

import json
import subprocess

import pytest
from mlflow.tracking import MlflowClient

from accelbench.training.profiling import profile_window, summarize_trace
from helpers import train_command, write_params


def _event(name: str, ts: float, dur: float, cat: str = "kernel") -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur}


def test_summary_splits_compute_from_allreduce_and_counts_overlap_once() -> None:
    # Two steps over 0..1000 µs: compute 0-300 and 500-800; an all-reduce 250-450 overlapping
    # compute by 50 µs; a copy 900-950; GPU idle 450-500 and 800-900.
    trace = {
        "traceEvents": [
            _event("ProfilerStep#1", 0, 500, "user_annotation"),
            _event("ProfilerStep#2", 500, 500, "user_annotation"),
            _event("ProfilerStep#1", 0, 480, "gpu_user_annotation"),  # the GPU track's copies
            _event("ProfilerStep#2", 500, 450, "gpu_user_annotation"),
            _event("warm_up_kernel", -400, 100),  # a profiler warm-up step's work: left out
            _event("late_kernel", 980, 40),  # after the last step's GPU work: left out
            _event("sm90_xmma_conv", 0, 300),
            _event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 250, 200),
            _event("triton_poi_fused_adam", 500, 300),
            _event("Memcpy DtoD", 900, 50, "gpu_memcpy"),
            _event("aten::add", 0, 999, "cpu_op"),  # host work: not GPU time
            {"ph": "i", "name": "instant", "cat": "kernel", "ts": 10},  # not a duration event
        ]
    }
    summary = summarize_trace(trace)
    assert summary["steps"] == 2
    assert summary["host_ms_per_step"] == pytest.approx(0.5)  # the GPU track's copy not counted
    assert summary["device_events"] == 4
    assert summary["span_ms_per_step"] == pytest.approx(0.475)  # 0..950 µs over 2 steps
    assert summary["busy_ms_per_step"] == pytest.approx(0.4)  # 450 + 300 + 50 µs
    assert summary["compute_ms_per_step"] == pytest.approx(0.325)  # 300 + 300 + 50 µs
    assert summary["allreduce_ms_per_step"] == pytest.approx(0.1)
    assert summary["exposed_allreduce_ms_per_step"] == pytest.approx(0.075)  # 150 µs not hidden
    assert summary["idle_share"] == pytest.approx(1 - 800 / 950)


def test_summary_of_a_cpu_only_trace_has_no_gpu_figures() -> None:
    trace = {"traceEvents": [_event("ProfilerStep#7", 0, 10, "user_annotation")]}
    summary = summarize_trace(trace)
    assert summary["steps"] == 1
    assert summary["span_ms_per_step"] is None and summary["idle_share"] is None


@pytest.mark.parametrize(
    ("steps_per_epoch", "window"),
    [(118, (5, 3, 20)), (33, (5, 3, 20)), (15, (5, 3, 6)), (5, (0, 1, 3)), (3, (0, 1, 1))],
)
def test_profile_window_stays_inside_epoch_2_before_its_last_batch(steps_per_epoch, window):
    assert profile_window(steps_per_epoch, 20) == window
    settle, warmup, active = window
    assert settle + warmup + active <= steps_per_epoch - 1


@pytest.mark.parametrize("steps_per_epoch", [1, 2])
def test_profile_window_refuses_epochs_too_short_to_hold_it(steps_per_epoch):
    with pytest.raises(ValueError, match="too short to profile"):
        profile_window(steps_per_epoch, 20)


@pytest.mark.slow
def test_train_with_profile_records_steady_steps_per_rank(tmp_path, prepared, mlflow_store) -> None:
    # 512 samples / batch 15 = 35 steps an epoch (the last one partial): epoch 1, 5 settling
    # and 3 profiler warm-up steps pass before the 20 recorded ones, all in epoch 2.
    variants = {"cpu": {"device": "cpu", "threads": 1}}
    params = write_params(tmp_path, variants, epochs=2, batch_size=15, schedule="constant")
    model, metrics, profile = tmp_path / "cpu.pt", tmp_path / "metrics", tmp_path / "profile"
    command = [*train_command(params, "cpu", prepared, model, metrics), "--profile", str(profile)]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    # Kineto's own lines on a CPU: "USDT:... profiler_start", "ERROR:... gpuGetDeviceCount failed"
    assert not [line for line in result.stderr.splitlines() if line.startswith(("USDT:", "ERROR:"))]

    summary = json.loads((profile / "cpu-rank0.json").read_text())
    assert summary["steps"] == 20
    assert summary["host_ms_per_step"] > 0
    assert summary["span_ms_per_step"] is None  # no GPU here
    assert "aten::convolution" in (profile / "cpu-rank0.txt").read_text()
    trace = json.loads((profile / "cpu-rank0.trace.json").read_text())
    steps = [e["name"] for e in trace["traceEvents"] if e["name"].startswith("ProfilerStep#")]
    assert steps[0] == "ProfilerStep#43" and steps[-1] == "ProfilerStep#62"  # 35 + 5 + 3 skipped

    # A second, refused request leaves the first profile alone and says why, before training.
    one_epoch = write_params(tmp_path, variants, epochs=1, batch_size=15)
    command[command.index(str(params))] = str(one_epoch)
    refused = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert "--profile records the second epoch this run trains" in refused.stderr
    assert "has 1 left (train.epochs 1)" in refused.stderr
    assert (profile / "cpu-rank0.json").exists()

    client = MlflowClient(mlflow_store)
    [run] = client.search_runs(
        [client.get_experiment_by_name("accelbench").experiment_id], "tags.variant = 'cpu'"
    )
    run_id = run.info.run_id
    logged = {a.path for a in client.list_artifacts(run_id, "profile")}
    assert logged == {f"profile/cpu-rank0.{ext}" for ext in ("json", "txt", "trace.json")}
