"""results.py: every result survives its JSON round trip, and a file that does not fit its
type fails where it is read, naming the keys."""

from __future__ import annotations

import errno
import json
import re
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from accelbench.core.console import InputError
from accelbench.core.env_facts import CudaFacts, read_env
from accelbench.core.outputs import MetricsFiles, staged, write_json
from accelbench.core.results import (
    ClassScores,
    EvalResult,
    EvalSummary,
    InferenceFigures,
    ModelFile,
    QuantizedResult,
    QuantizedSummary,
    Skipped,
    TrainResult,
    parse,
    read,
    read_epoch_records,
    scaling_efficiency,
    speedup,
    steady_epochs,
    write_epochs_csv,
)
from helpers import trained_summary
from test_report import ENV, NO_GPU, epoch


def test_train_results_round_trip_through_their_file(tmp_path) -> None:
    files = MetricsFiles(tmp_path)
    for result in (trained_summary(0.5, world_size=2), Skipped("no GPU here", "cuda")):
        write_json(files.train_json, result.to_json())
        assert read(TrainResult, files.train_json) == result


def test_eval_summary_round_trips_with_sklearn_key_names() -> None:
    summary = EvalSummary(0.99, 0.03, 0.98, 1e5, {"3": ClassScores(0.9, 0.95, 0.925)})
    payload = json.loads(json.dumps(summary.to_json()))
    assert payload["per_class"]["3"]["f1-score"] == 0.925
    assert parse(EvalResult, payload, "eval.json") == summary
    skipped = {"status": "skipped", "reason": "r", "device": None}
    assert parse(EvalResult, skipped, "eval.json") == Skipped("r")


def test_a_renamed_key_fails_loudly_where_it_is_read() -> None:
    payload = trained_summary(0.5).to_json()
    payload["steady_epoch_seconds"] = payload.pop("steady_epoch_s")
    with pytest.raises(ValueError, match=r"metrics/x/train.json is invalid: steady_epoch_s: "
                       r"required key is missing; steady_epoch_seconds: unknown key"):  # fmt: skip
        parse(TrainResult, payload, "metrics/x/train.json")


def test_the_model_file_round_trips(tmp_path) -> None:
    model = ModelFile("cpu", "trained", "run-1", {"variant": {"name": "cpu"}}, {"w": torch.ones(2)})
    model.save(tmp_path / "cpu.pt")
    loaded = ModelFile.load(tmp_path / "cpu.pt")
    assert loaded.trained and loaded.params == model.params and loaded.mlflow_run_id == "run-1"
    assert torch.equal(loaded.state_dict["w"], torch.ones(2))
    skipped = ModelFile("gpu", "skipped", None, reason="no GPU")
    skipped.save(tmp_path / "gpu.pt")
    assert ModelFile.load(tmp_path / "gpu.pt") == skipped


def test_speedup_and_efficiency_need_two_trained_steady_states() -> None:
    base, fast = trained_summary(10.0), trained_summary(0.5, world_size=2)
    assert speedup(base, fast) == 20.0 and scaling_efficiency(20.0, 2) == 10.0
    assert speedup(None, fast) is None and speedup(Skipped("no GPU"), fast) is None
    assert speedup(base, trained_summary(None, first_epoch_s=1.0, total_train_s=1.0)) is None
    assert scaling_efficiency(None, 2) is None


def test_a_save_that_fails_midway_keeps_the_old_file_and_no_temporary(
    tmp_path, monkeypatch
) -> None:
    """A disk that fills while a checkpoint or model is written (it left `.cpu.pt.tmp`)."""
    import errno

    from accelbench.core.results import atomic_torch_save

    path = tmp_path / "cpu.pt"
    atomic_torch_save({"epochs_done": 1}, path)

    def disk_full(payload, target) -> None:  # target: the temporary's open file
        target.write(b"partial")
        target.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        atomic_torch_save({"epochs_done": 2}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True) == {"epochs_done": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu.pt"]


def test_class_scores_match_scikit_learn() -> None:
    """The evaluate stage's per-class scores, from the confusion matrix, are sklearn's."""
    import numpy as np
    from sklearn.metrics import classification_report

    from accelbench.evaluation import confusion
    from accelbench.evaluation.confusion import class_scores

    rng = np.random.default_rng(0)
    y_true = rng.integers(0, 9, 500)  # class 9 never occurs
    y_pred = np.where(rng.random(500) < 0.8, y_true, rng.integers(0, 10, 500))
    y_pred[y_pred == 3] = 4  # class 3 never predicted: precision undefined -> 0
    expected = classification_report(y_true, y_pred, output_dict=True, zero_division=0)
    counts = confusion.matrix(y_true, y_pred)
    assert counts.sum() == 500 and counts[2, 2] == ((y_true == 2) & (y_pred == 2)).sum()
    scores = class_scores(counts)
    assert set(scores) == {k for k in expected if k.isdigit()}
    for digit, s in scores.items():
        assert s.precision == pytest.approx(expected[digit]["precision"])
        assert s.recall == pytest.approx(expected[digit]["recall"])
        assert s.f1_score == pytest.approx(expected[digit]["f1-score"])


def test_staged_outputs_replace_links_never_their_targets(tmp_path) -> None:
    """A symlink at an output (and one a crash or someone left at its temporary's name) and
    a hard link into DVC's cache: the targets keep their content, the outputs are new files."""
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = MetricsFiles(tmp_path / "metrics")
    write_json(folder.train_json, Skipped("old").to_json())
    write_epochs_csv(folder.epochs_csv, [])
    cache_object, linked_target, trap = (outside / n for n in ("cache", "linked", "trap"))
    cache_object.write_bytes(folder.train_json.read_bytes())
    folder.train_json.unlink()
    folder.train_json.hardlink_to(cache_object)
    linked_target.write_bytes(folder.epochs_csv.read_bytes())
    folder.epochs_csv.unlink()
    folder.epochs_csv.symlink_to(linked_target)
    trap.write_text("not to be written")
    (folder.folder / ".new.train.json").symlink_to(trap)
    before = {p: p.read_bytes() for p in (cache_object, linked_target, trap)}

    with staged() as outputs:
        write_json(outputs(folder.train_json), Skipped("new").to_json())
        write_epochs_csv(outputs(folder.epochs_csv), [epoch(1, 2.0, 0.9, train_loss=0.5)])

    assert {p: p.read_bytes() for p in before} == before
    assert read(TrainResult, folder.train_json) == Skipped("new")
    assert not folder.epochs_csv.is_symlink() and "0.5" in folder.epochs_csv.read_text()
    assert folder.train_json.stat().st_ino != cache_object.stat().st_ino
    assert sorted(p.name for p in folder.folder.iterdir()) == ["epochs.csv", "train.json"]


def test_a_foreign_file_at_an_output_path_is_refused_and_nothing_is_renamed(tmp_path) -> None:
    import os

    files = MetricsFiles(tmp_path)
    write_json(files.eval_json, Skipped("old").to_json())
    files.confusion_csv.write_text("my,own\ncsv,file\n")
    os.mkfifo(files.confusion_png)  # never opened: a read would block
    for foreign, found in ((files.confusion_csv, "a file"), (files.confusion_png, "a special")):
        refused = pytest.raises(
            InputError, match=f"{re.escape(str(foreign))}: exists and is {found}"
        )
        with refused as raised, staged() as outputs:
            write_json(outputs(files.eval_json), Skipped("new").to_json())
            outputs(foreign).write_text("ours")
        assert "move it away or pass another path" in str(raised.value)
        assert read(TrainResult, files.eval_json) == Skipped("old")  # all old
    assert files.confusion_csv.read_text() == "my,own\ncsv,file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "confusion.csv",
        "confusion.png",
        "eval.json",
    ]


def test_env_facts_round_trip_through_their_files(tmp_path) -> None:
    for facts in (ENV, replace(ENV, cuda=NO_GPU)):
        for device, payload in facts.files().items():
            write_json(tmp_path / f"{device}.json", payload)
        assert read_env(tmp_path) == facts


GPU_JSON, NO_GPU_JSON = ENV.cuda.to_json(), NO_GPU.to_json()
CUDA_MISFITS = {
    "a reason beside usable GPUs": GPU_JSON | {"reason": "why"},
    "a GPU key renamed": {("gpu_name" if k == "gpu_names" else k): v for k, v in GPU_JSON.items()},
    "cuda_available as text": GPU_JSON | {"cuda_available": "true"},
    "no GPU and no reason": {k: v for k, v in NO_GPU_JSON.items() if k != "reason"},
    "a GPU's facts though no GPU is usable": NO_GPU_JSON | {"gpu_count": 1},
}


@pytest.mark.parametrize("payload", CUDA_MISFITS.values(), ids=CUDA_MISFITS)
def test_cuda_facts_that_do_not_fit_are_refused(payload) -> None:
    with pytest.raises(InputError, match=r"^env/cuda\.json is invalid: "):
        parse(CudaFacts, payload, "env/cuda.json")


def test_quantized_figures_round_trip_and_a_renamed_figure_is_refused(tmp_path) -> None:
    summary = QuantizedSummary(
        threads=2, batch_size=256, latency_repeats=10,
        methods={"fp32": InferenceFigures("fp32", 0.99, 0.5, 1e4, 400_000)},
        unsupported={"static_int8": "no x86 engine"},
    )  # fmt: skip
    path = tmp_path / "quantized.json"
    write_json(path, summary.to_json())
    assert read(QuantizedResult, path) == summary
    assert summary.metrics()["quant_fp32_latency_ms"] == 0.5
    renamed = summary.to_json()
    renamed["methods"]["fp32"]["latency"] = renamed["methods"]["fp32"].pop("latency_ms")
    write_json(path, renamed)
    with pytest.raises(InputError, match=r"methods\.fp32\.latency: unknown key"):
        read(QuantizedResult, path)
    write_json(path, summary.to_json() | {"methods": {"int4": {}}})
    with pytest.raises(
        InputError,
        match=r"methods\.int4 = 'int4': Input should be 'fp32', 'dynamic_int8' or 'static_int8'",
    ):
        read(QuantizedResult, path)


def test_a_renamed_energy_column_fails_instead_of_costing_the_stated_wattage(tmp_path) -> None:
    path = tmp_path / "epochs.csv"
    write_epochs_csv(path, [epoch(1, 2.0, 0.9, gpu_energy_j=300.0), epoch(2, 1.0, 0.95)])
    records = read_epoch_records(path)
    assert [r.gpu_energy_j for r in records] == [300.0, None]  # None: not measured
    path.write_text(path.read_text().replace("gpu_energy_j", "gpu_energy"))
    with pytest.raises(InputError, match="gpu_energy"):
        read_epoch_records(path)


def test_the_warm_up_mark_goes_through_epochs_csv_and_a_bad_one_is_named(tmp_path) -> None:
    path = tmp_path / "epochs.csv"
    write_epochs_csv(path, [epoch(1, 2.0, 0.9, warm_up=True), epoch(2, 1.0, 0.95)])
    assert [r.warm_up for r in read_epoch_records(path)] == [True, False]
    assert steady_epochs(read_epoch_records(path)) == [epoch(2, 1.0, 0.95)]
    path.write_text(path.read_text().replace("True", "yes"))
    with pytest.raises(InputError, match="warm_up = 'yes': Input should be a valid boolean"):
        read_epoch_records(path)


def test_a_torch_save_past_a_file_size_limit_is_an_os_error(tmp_path) -> None:
    """Under `ulimit -f` (or a quota) torch's zip writer raised "RuntimeError: [enforce fail at
    inline_container.cc:672] . unexpected pos ...", a bug report to the CLI; the old file
    stays, no temporary is left. (A full disk: tests/test_outputs.py, on a real tmpfs.)"""
    path = tmp_path / "model.pt"
    path.write_bytes(b"old")
    probe = (
        "import resource, sys, torch\n"
        "from pathlib import Path\n"
        "from accelbench.core.results import atomic_torch_save\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))\n"
        "try:\n"
        "    atomic_torch_save({'w': torch.zeros(1 << 20)}, Path(sys.argv[1]))\n"
        "except OSError as exc:\n"
        "    print(exc.errno, exc.filename)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=120
    )
    assert result.stdout.split() == [str(errno.EFBIG), str(path)], result.stderr[-2000:]
    assert path.read_bytes() == b"old" and sorted(tmp_path.iterdir()) == [path]


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("steady_epoch_s", "fast", "steady_epoch_s = 'fast': Input should be a valid number"),
        ("epochs", 2.5, "epochs = 2.5: Input should be a valid integer"),
        ("epochs", True, "epochs = True: Input should be a valid integer"),
        ("device", 3, "device = 3: Input should be a valid string"),
        ("final_test_accuracy", 7, "final_test_accuracy = 7: not a fraction in 0..1"),
        ("best_test_accuracy", float("nan"), "best_test_accuracy = nan: not a fraction in 0..1"),
    ],
)
def test_a_tampered_train_json_names_the_field_before_compare_uses_it(field, value, says) -> None:
    """A hand-edited train.json failed later as "unexpected TypeError ... report it", or was
    reported as it said ("Test accuracy 700.00%")."""
    payload = trained_summary(1.0).to_json() | {field: value}
    with pytest.raises(InputError) as raised:
        parse(TrainResult, payload, "metrics/cpu/train.json")
    assert str(raised.value) == (
        f"metrics/cpu/train.json is invalid: {says}; re-run the stage that writes it"
    )


def test_a_tampered_eval_json_names_the_field() -> None:
    scores = {str(d): ClassScores(0.99, 0.99, 0.99) for d in range(10)}
    payload = EvalSummary(0.99, 0.03, 0.99, 5000.0, scores).to_json()
    assert parse(EvalResult, payload, "eval.json").test_accuracy == 0.99
    for value, says in (
        ("high", "'high': Input should be a valid number"),
        (7.0, "7.0: not a fraction in 0..1"),
    ):
        with pytest.raises(InputError, match=f"eval.json is invalid: test_accuracy = {says}"):
            parse(EvalResult, payload | {"test_accuracy": value}, "eval.json")
