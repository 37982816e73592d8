"""Faults injected on purpose: the recorded state must tell the truth."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from accelbench import tracking
from conftest import REPO, train_command, write_params


def _runs(store: str, name: str):
    client = MlflowClient(store)
    experiment = client.get_experiment_by_name(tracking.EXPERIMENT)
    if experiment is None:
        return []
    return client.search_runs([experiment.experiment_id], f"attributes.run_name = '{name}'")


def test_sigterm_marks_the_run_killed_and_writes_no_outputs(
    tmp_path, prepared, mlflow_store
) -> None:
    command = _train_command(tmp_path, prepared, epochs=200)
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_store}
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(r.info.status == "RUNNING" for r in _runs(mlflow_store, "cpu")):
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline, "the run never started"
        time.sleep(0.5)
    time.sleep(2)  # inside training
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    assert "interrupted (signal SIGTERM)" in stderr
    [run] = _runs(mlflow_store, "cpu")
    assert run.info.status == "KILLED"
    assert not (tmp_path / "cpu.pt").exists()
    assert not (tmp_path / "metrics" / "train.json").exists()


def test_an_exception_marks_the_run_failed(tmp_path, mlflow_store) -> None:
    with pytest.raises(RuntimeError, match="boom"), tracking.variant_run(tmp_path, "x", {}, {}):
        raise RuntimeError("boom")
    [run] = _runs(mlflow_store, "x")
    assert run.info.status == "FAILED"
    with tracking.variant_run(tmp_path, "y", {}, {}):
        pass
    assert _runs(mlflow_store, "y")[0].info.status == "FINISHED"


def test_consecutive_nonfinite_losses_fail_naming_epoch_and_step(prepared, monkeypatch) -> None:
    import types

    import torch
    import torch.nn.functional as F

    from accelbench import data, engine
    from accelbench.batches import ResidentBatches
    from accelbench.models import SeedCNN
    from accelbench.params import TrainParams, VariantParams

    calls = {"n": 0}

    def poisoned_cross_entropy(logits, labels, **kwargs):
        loss = F.cross_entropy(logits, labels, **kwargs)
        if logits.requires_grad:  # training steps only
            calls["n"] += 1
            if calls["n"] > 5:  # from the 6th step (epoch 2, step 2) on: an inf loss
                loss = loss + float("inf")
        return loss

    monkeypatch.setattr(
        engine, "F", types.SimpleNamespace(cross_entropy=poisoned_cross_entropy, pad=F.pad)
    )
    cpu = torch.device("cpu")
    train = TrainParams(epochs=3, batch_size=128, max_nonfinite_steps=2)  # 4 steps an epoch
    batches = ResidentBatches(data.load_split(prepared, "train"), cpu, 128, 0)
    test = ResidentBatches(data.load_split(prepared, "test"), cpu, 256, 0, shuffle=False)
    with pytest.raises(engine.NonFiniteLossError, match=r"epoch 2, step 3: 2 consecutive") as info:
        engine.fit(SeedCNN(), batches, test, train, VariantParams(device="cpu"), cpu)
    assert "lower train.lr" in str(info.value)


def test_the_limit_counts_consecutive_steps_only() -> None:
    import torch

    from accelbench import engine
    from accelbench.params import VariantParams

    finite = torch.tensor([True, False, True, False, False, True])
    engine.check_nonfinite(finite, 1, 3, VariantParams(device="cpu"))  # two in a row: allowed
    fp16 = VariantParams(device="cuda", precision="fp16")
    with pytest.raises(engine.NonFiniteLossError, match=r"epoch 4, step 5.*precision 'bf16'"):
        engine.check_nonfinite(finite, 4, 2, fp16)


def test_deterministic_mode_gives_identical_weights(prepared) -> None:
    import torch

    from accelbench import data, engine
    from accelbench.batches import ResidentBatches
    from accelbench.models import SeedCNN
    from accelbench.params import TrainParams, VariantParams

    cpu, variant = torch.device("cpu"), VariantParams(device="cpu")
    train = TrainParams(epochs=1, batch_size=128, deterministic=True, shift_px=2)
    environ: dict[str, str] = {}
    engine.request_determinism(environ)
    assert environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    weights = []
    try:
        for _ in range(2):
            engine.configure_backends(variant, train.deterministic)
            assert torch.are_deterministic_algorithms_enabled()
            engine.seed_everything(train.seed)
            model = SeedCNN()
            batches = ResidentBatches(data.load_split(prepared, "train"), cpu, 128, 0)
            test = ResidentBatches(data.load_split(prepared, "test"), cpu, 256, 0, shuffle=False)
            engine.fit(model, batches, test, train, variant, cpu)
            weights.append(model.state_dict())
    finally:
        engine.configure_backends(variant, False)
    for name, value in weights[0].items():
        assert torch.equal(value, weights[1][name]), name


def _train_command(tmp_path: Path, prepared: Path, epochs: int) -> list[str]:
    params = write_params(tmp_path, epochs=epochs, batch_size=64)
    return train_command(params, "cpu", prepared, tmp_path / "cpu.pt", tmp_path / "metrics")


def test_closed_tracking_port_costs_seconds_and_loses_no_outputs(tmp_path, prepared) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"}
    started = time.monotonic()
    result = subprocess.run(
        _train_command(tmp_path, prepared, epochs=2),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("WARNING: MLflow tracking") == 1
    assert (tmp_path / "cpu.pt").exists() and (tmp_path / "metrics" / "train.json").exists()
    assert time.monotonic() - started < 120


def test_tracking_server_dying_mid_run(tmp_path, prepared) -> None:
    sys.path.insert(0, str(REPO / "tools"))
    import mlflow_ui

    store = tmp_path / "server.db"
    url, server = mlflow_ui.start_server(store)
    try:
        env = {**os.environ, "MLFLOW_TRACKING_URI": url}
        deadline = time.monotonic() + 90
        training = subprocess.Popen(
            _train_command(tmp_path, prepared, epochs=8),
            cwd=tmp_path,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        client = MlflowClient(f"sqlite:///{store}")
        while True:  # until the first epoch's metrics reached the server
            runs = _runs(f"sqlite:///{store}", "cpu")
            if runs and client.get_metric_history(runs[0].info.run_id, "test_accuracy"):
                break
            assert training.poll() is None, training.stderr.read()
            assert time.monotonic() < deadline + 120, "no epoch was ever logged"
            time.sleep(0.5)
    finally:
        mlflow_ui.stop_server(server, signal.SIGKILL)  # the server dies mid-run
    _, stderr = training.communicate(timeout=300)
    assert training.returncode == 0, stderr[-3000:]
    assert stderr.count("WARNING: MLflow tracking") == 1
    assert (tmp_path / "cpu.pt").exists() and (tmp_path / "metrics" / "train.json").exists()
    [run] = _runs(f"sqlite:///{store}", "cpu")
    assert run.info.status == "RUNNING"  # the server died before it could be told; see README


def test_sigkill_then_rerun_resumes_to_bitwise_identical_weights(
    tmp_path, prepared, mlflow_store
) -> None:
    import torch

    params = write_params(
        tmp_path, {"cpu": {"device": "cpu", "threads": 1}}, epochs=5, batch_size=64
    )
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_store}

    def command(run: str) -> list[str]:
        out = tmp_path / run
        return train_command(
            params, "cpu", prepared, out / "cpu.pt", out / "metrics", out / "checkpoint.pt"
        )

    whole = subprocess.run(command("whole"), cwd=tmp_path, env=env, capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert not (tmp_path / "whole" / "checkpoint.pt").exists()  # removed once finished

    checkpoint = tmp_path / "killed" / "checkpoint.pt"
    process = subprocess.Popen(command("killed"), cwd=tmp_path, env=env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while not (
        checkpoint.exists()
        and torch.load(checkpoint, weights_only=False)["state"]["epochs_done"] >= 2
    ):
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (tmp_path / "killed" / "cpu.pt").exists()

    resumed = subprocess.run(
        command("killed"), cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming after epoch" in resumed.stderr
    a = torch.load(tmp_path / "whole" / "cpu.pt", weights_only=True)["state_dict"]
    b = torch.load(tmp_path / "killed" / "cpu.pt", weights_only=True)["state_dict"]
    for name, value in a.items():
        assert torch.equal(value, b[name]), name
    epochs = (tmp_path / "killed" / "metrics" / "epochs.csv").read_text().splitlines()
    assert len(epochs) == 1 + 5  # every epoch recorded once

    runs = _runs(mlflow_store, "cpu")
    statuses = sorted(r.info.status for r in runs)
    assert statuses == ["FINISHED", "FINISHED"]  # the killed run was continued, not duplicated


def test_checkpoint_from_other_params_is_not_resumed(tmp_path, prepared, mlflow_store) -> None:
    from accelbench import stages

    stale = tmp_path / "checkpoint.pt"
    stages._atomic_save({"fingerprint": "other", "mlflow_run_id": None, "state": {}}, stale)
    assert stages._load_checkpoint(stale, "mine", "cpu") is None


def test_accumulated_chunks_give_the_update_of_one_whole_batch(prepared) -> None:
    import torch

    from accelbench import data, engine
    from accelbench.batches import ResidentBatches
    from accelbench.models import SeedCNN
    from accelbench.params import TrainParams, VariantParams

    cpu, variant = torch.device("cpu"), VariantParams(device="cpu")
    weights = {}
    for k in (1, 4):
        train = TrainParams(epochs=1, batch_size=128, dropout=0.0, accumulation_steps=k)
        engine.seed_everything(0)
        model = SeedCNN(dropout=0.0)
        batches = ResidentBatches(data.load_split(prepared, "train"), cpu, 128, 0)
        test = ResidentBatches(data.load_split(prepared, "test"), cpu, 256, 0, shuffle=False)
        records = engine.fit(model, batches, test, train, variant, cpu)
        weights[k] = (model.state_dict(), records[0].train_loss)
    for name, value in weights[1][0].items():
        torch.testing.assert_close(weights[4][0][name], value, rtol=1e-4, atol=1e-6, msg=name)
    assert abs(weights[4][1] - weights[1][1]) < 1e-5


def _oom_when_passes_exceed(limit: int, monkeypatch):
    import torch

    from accelbench import engine

    real_fit = engine.fit
    tried = []

    def fit(model, train_batches, test_batches, train, *args, **kwargs):
        per_pass = train.batch_size // train.accumulation_steps
        tried.append(per_pass)
        if per_pass > limit:  # what the allocator would say on a GPU that is too small
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_fit(model, train_batches, test_batches, train, *args, **kwargs)

    monkeypatch.setattr(engine, "fit", fit)
    return tried


def test_out_of_memory_halves_the_pass_and_keeps_the_batch(
    tmp_path, prepared, mlflow_store, monkeypatch
) -> None:
    import json

    from accelbench import stages
    from test_stages import small_params

    tried = _oom_when_passes_exceed(40, monkeypatch)
    params = small_params(oom_retries=3)  # batch 128: 128 -> 64 -> 32 samples per pass
    out = stages.TrainOutputs(tmp_path / "cpu.pt", tmp_path / "metrics")
    stages.train_stage(tmp_path, params, "cpu", prepared, out, quiet=True)
    assert tried == [128, 64, 32]
    summary = json.loads(out.train_json.read_text())
    assert summary["accumulation_steps"] == 4 and summary["status"] == "trained"


def test_out_of_memory_without_retries_explains_what_to_change(
    tmp_path, prepared, mlflow_store, monkeypatch
) -> None:
    from accelbench import stages
    from test_stages import small_params

    _oom_when_passes_exceed(40, monkeypatch)
    out = stages.TrainOutputs(tmp_path / "cpu.pt", tmp_path / "metrics")
    with pytest.raises(stages.StageError) as info:
        stages.train_stage(tmp_path, small_params(), "cpu", prepared, out, quiet=True)
    message = str(info.value)
    assert "batch 128" in message and "accumulation_steps" in message and "oom_retries" in message
    assert not out.model.exists()


def test_gradscaler_skipped_steps_are_counted(prepared, monkeypatch) -> None:
    """fp16 + GradScaler, on the CPU: an inf loss gives inf gradients, a skipped step."""
    import types

    import torch
    import torch.nn.functional as F

    from accelbench import data, engine
    from accelbench.batches import ResidentBatches
    from accelbench.models import SeedCNN
    from accelbench.params import TrainParams, VariantParams

    calls = {"n": 0}

    def cross_entropy(logits, labels, **kwargs):
        loss = F.cross_entropy(logits, labels, **kwargs)
        if logits.requires_grad:
            calls["n"] += 1
            if calls["n"] in (2, 3):  # two bad steps in epoch 1 (4 steps an epoch)
                loss = loss * float("inf")
        return loss

    monkeypatch.setattr(engine, "F", types.SimpleNamespace(cross_entropy=cross_entropy, pad=F.pad))
    cpu = torch.device("cpu")
    fp16 = VariantParams.model_construct(device="cpu", precision="fp16")  # GPU-only in params
    train = TrainParams(epochs=2, batch_size=128, shift_px=0)
    batches = ResidentBatches(data.load_split(prepared, "train"), cpu, 128, 0)
    test = ResidentBatches(data.load_split(prepared, "test"), cpu, 256, 0, shuffle=False)
    model = SeedCNN()
    records = engine.fit(model, batches, test, train, fp16, cpu)
    assert [r.scaler_skipped_steps for r in records] == [2, 0]
    assert [r.nonfinite_steps for r in records] == [2, 0]
    assert all(torch.isfinite(p).all() for p in model.parameters())  # never trained on inf
    assert engine.summarize(records, 0.99)["scaler_skipped_steps"] == 2


@pytest.mark.gpu
def test_deterministic_mode_on_the_gpu(prepared) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from accelbench import data, engine
    from accelbench.batches import ResidentBatches
    from accelbench.models import SeedCNN
    from accelbench.params import TrainParams, VariantParams

    cuda, variant = torch.device("cuda"), VariantParams(device="cuda")
    train = TrainParams(epochs=1, batch_size=128, deterministic=True)
    weights = []
    try:
        for _ in range(2):
            engine.configure_backends(variant, True)
            engine.seed_everything(0)
            model = SeedCNN().to(cuda)
            batches = ResidentBatches(data.load_split(prepared, "train"), cuda, 128, 0)
            test = ResidentBatches(data.load_split(prepared, "test"), cuda, 256, 0, shuffle=False)
            engine.fit(model, batches, test, train, variant, cuda)
            weights.append({k: v.cpu() for k, v in model.state_dict().items()})
    finally:
        engine.configure_backends(variant, False)
    for name, value in weights[0].items():
        assert torch.equal(value, weights[1][name]), name
