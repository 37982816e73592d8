"""stages/train.py: placement (skip, refuse), resuming after a kill, the outputs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest
import torch

from accelbench.core.console import StageError
from accelbench.core.outputs import MetricsFiles
from accelbench.core.params import ParamsError
from accelbench.stages import train as train_stage
from accelbench.system.tracking.store import EXPERIMENT
from helpers import mlflow_runs, small_params, train_command, write_params


def _outputs(folder):
    return train_stage.TrainOutputs(folder / "model.pt", MetricsFiles(folder / "metrics"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_require_gpu_fails_clearly_without_cuda(tmp_path, prepared, mlflow_store) -> None:
    inputs = train_stage.select(small_params(require_gpu=True), "gpu")
    out = _outputs(tmp_path)
    with pytest.raises(StageError, match=r"needs CUDA .*train\.require_gpu: false"):
        train_stage.run(tmp_path, "gpu", inputs, prepared, out, quiet=True)
    assert not out.model.exists()


def test_unknown_variant_is_refused() -> None:
    with pytest.raises(ParamsError, match=r"unknown variant 'tpu'; params\.yaml defines: cpu"):
        train_stage.select(small_params(), "tpu")


def test_the_stage_reads_the_recipe_not_the_report_keys() -> None:
    inputs = train_stage.select(small_params(target_accuracy=0.5, require_gpu=True), "cpu")
    assert not hasattr(inputs.recipe, "target_accuracy")
    assert inputs.recipe.batch_size == 128 and inputs.require_gpu is True


@pytest.mark.slow
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

    runs = mlflow_runs(mlflow_store, "cpu")
    statuses = sorted(r.info.status for r in runs)
    assert statuses == ["FINISHED", "FINISHED"]  # the killed run was continued, not duplicated


@pytest.mark.slow
def test_outputs_are_all_new_or_all_old_and_leftovers_go(
    tmp_path, prepared, mlflow_store, monkeypatch
) -> None:
    """A disk that fills while the model is written (after the metrics were): the earlier
    run's outputs stay, all of them; an earlier crash's temporaries are removed on start."""
    import errno

    from accelbench.core.results import ModelFile

    inputs = train_stage.select(small_params(epochs=1), "cpu")
    out = _outputs(tmp_path)
    train_stage.run(tmp_path, "cpu", inputs, prepared, out, quiet=True)
    before = {
        p: p.read_bytes() for p in (out.model, out.metrics.train_json, out.metrics.epochs_csv)
    }
    crash = [
        tmp_path / ".new.model.pt",
        tmp_path / ".model.pt.tmp",
        out.metrics.folder / ".new.train.json",
    ]
    for leftover in crash:
        leftover.write_bytes(b"half-written")

    def disk_full(self, path) -> None:
        path.write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(ModelFile, "save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        train_stage.run(
            tmp_path,
            "cpu",
            train_stage.select(small_params(epochs=2), "cpu"),
            prepared,
            out,
            quiet=True,
        )
    assert {p: p.read_bytes() for p in before} == before
    hidden = sorted(p.name for p in tmp_path.rglob(".*") if p.is_file())
    assert [h for h in hidden if ".new." in h or h.endswith(".tmp")] == []


@pytest.mark.slow
def test_repeats_time_more_trainings_and_keep_the_first(tmp_path, prepared, mlflow_store) -> None:
    """train.repeats: 2 trains once more from scratch, timed only: its steady epochs join the
    samples; the model, epochs.csv and the MLflow run's per-epoch metrics are the first's."""
    import json

    from mlflow.tracking import MlflowClient

    from accelbench.core import phases

    variants = {"cpu": {"device": "cpu", "threads": 1}}
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_store}
    results, timings = {}, {}
    for repeats in (1, 2):
        params = write_params(tmp_path, variants, epochs=3, batch_size=64, repeats=repeats)
        out = tmp_path / f"r{repeats}"
        command = train_command(params, "cpu", prepared, out / "cpu.pt", out / "metrics")
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        results[repeats] = json.loads((out / "metrics" / "train.json").read_text())
        timings[repeats] = {t.stage: t for t in phases.read_all(tmp_path)}["train@cpu"]
    once, twice = results[1], results[2]
    # the stage's time to its model leaves the repeat out: at least its epochs, never the run's
    assert timings[1].repeats_s < 0.01  # none to train
    repeat_epochs_s = sum(seconds for seconds, _ in twice["repeat_epochs"][0])
    assert repeat_epochs_s < timings[2].repeats_s < timings[2].wall_s - twice["total_train_s"]
    assert (once["repeats"], len(once["steady_epochs_s"])) == (1, 2)
    assert (twice["repeats"], len(twice["steady_epochs_s"])) == (2, 4)
    assert twice["steady_epochs_s"][:2] != twice["steady_epochs_s"][2:]  # measured, not copied
    weights = [torch.load(tmp_path / f"r{r}" / "cpu.pt")["state_dict"] for r in (1, 2)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert (tmp_path / "r2" / "metrics" / "epochs.csv").read_text().count("\n") == 4
    client = MlflowClient(mlflow_store)
    experiment = client.get_experiment_by_name(EXPERIMENT).experiment_id
    run = client.search_runs([experiment], order_by=["attributes.start_time DESC"])[0]
    assert len(client.get_metric_history(run.info.run_id, "train_time_s")) == 3


@pytest.mark.slow
def test_the_stage_records_its_phases_around_the_fit(tmp_path, prepared, mlflow_store) -> None:
    """The engine records nothing itself: the stage and loop.py time the parts of a fit
    outside its epochs (step set-up, evaluation, checkpoints) under the same phase names."""
    from accelbench.core import phases

    recorder = phases.Recorder()
    inputs = train_stage.select(small_params(epochs=2), "cpu")
    out = train_stage.TrainOutputs(
        tmp_path / "model.pt", MetricsFiles(tmp_path / "metrics"), tmp_path / "checkpoint.pt"
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(phases, "RECORDER", recorder)
        patch.setattr(phases, "phase", recorder.phase)
        train_stage.run(tmp_path, "cpu", inputs, prepared, out, quiet=True)
    recorded = set(recorder.seconds)
    assert recorded >= {"imports", "device", "model", "data", "checkpoint", "mlflow"}
    assert recorded >= {"training", "step_setup", "evaluation", "outputs"}
    assert recorder.training_s > 0


def test_a_dataloader_trainings_workers_end_with_it(
    tmp_path, prepared, mlflow_store, monkeypatch
) -> None:
    """Persistent DataLoader workers end when the training does, before its outputs are
    logged, not at the process's exit, where (pinned memory on an H200 host) they kept a
    finished stage alive for 20 s."""
    import multiprocessing

    workers_at_logging = []
    log_trained = train_stage._Tracked.trained
    others = set(multiprocessing.active_children())  # another test's, still ending

    def trained(self, *args) -> None:
        workers_at_logging.append(len(set(multiprocessing.active_children()) - others))
        log_trained(self, *args)

    monkeypatch.setattr(train_stage._Tracked, "trained", trained)
    loader = {"num_workers": 2, "pin_memory": False, "persistent_workers": True}
    variants = {"cpu": {"device": "cpu", "threads": 1, "batches": "dataloader", "loader": loader}}
    inputs = train_stage.select(small_params(variants, epochs=2, batch_size=128), "cpu")
    out = train_stage.TrainOutputs(tmp_path / "model.pt", MetricsFiles(tmp_path / "metrics"))
    summary = train_stage.run(tmp_path, "cpu", inputs, prepared, out, quiet=True)
    assert summary is not None and summary.epochs == 2
    assert workers_at_logging == [0]


def test_an_epoch_the_process_was_stopped_in_is_marked_and_in_no_steady_figure(
    tmp_path, prepared, mlflow_store
) -> None:
    """SIGSTOP for 30 s during epoch 2 of 3 made that epoch 34.8 s, and half the steady
    figure. Stopped 2 s here, in a real training process."""
    from accelbench.core.results import TrainResult, read, read_epoch_records

    cpu = {"cpu": {"device": "cpu", "threads": 1}}
    params = write_params(tmp_path, cpu, epochs=3, repeats=1, batch_size=2)
    command = train_command(params, "cpu", prepared, tmp_path / "cpu.pt", tmp_path / "metrics")
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_store}
    process = subprocess.Popen(
        [arg for arg in command if arg != "--quiet"],  # one line per epoch on stderr
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    while "epoch 1/3" not in (lines[-1] if lines else ""):
        lines.append(process.stderr.readline())
        assert lines[-1] or process.poll() is None, "".join(lines)[-3000:]
    time.sleep(0.1)  # into epoch 2 (256 steps: about a second)
    process.send_signal(signal.SIGSTOP)
    time.sleep(2)
    process.send_signal(signal.SIGCONT)
    rest = process.communicate(timeout=120)[1]
    assert process.returncode == 0, rest[-3000:]
    # a lower bound: CPU time the process used in the gap around the stop is not counted
    assert re.search(r"cpu epoch 2/3: .*, STOPPED (1\.[7-9]|2\.[0-4]) s", rest), rest[-3000:]

    epochs = read_epoch_records(tmp_path / "metrics" / "epochs.csv")
    assert epochs[1].stopped and 1.7 < epochs[1].stopped_s < 2.5, epochs
    steady = read(TrainResult, tmp_path / "metrics" / "train.json").steady_epochs_s
    assert epochs[1].train_time_s not in steady
    assert steady == [e.train_time_s for e in epochs[2:] if not e.stopped]  # as warm-up epochs
