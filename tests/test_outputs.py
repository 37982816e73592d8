"""What accelbench writes (docs/reliability.md): only its own outputs, never through a link,
never half-written. Real files, links, processes and a full tmpfs."""

from __future__ import annotations

import errno
import functools
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import test_report
from accelbench.core.console import InputError
from accelbench.core.outputs import MetricsFiles, write_json
from accelbench.core.results import ClassScores, EvalSummary, RunRecord, Skipped, write_epochs_csv
from accelbench.data import mnist
from accelbench.data.datasets import DATASETS
from accelbench.data.prepared import MANIFEST, prepare, prepared_dataset
from accelbench.stages import compare, quantize
from accelbench.system import tracking
from helpers import shared_mnist, small_params, trained_summary, write_params

VARIANTS = {"cpu": {"device": "cpu"}}
ENV = replace(test_report.ENV, cuda=test_report.NO_GPU)


def _accelbench(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """The CLI in a real process, with the repository's params (variants: cpu only)."""
    params = write_params(cwd, variants=VARIANTS, epochs=2)
    command = [sys.executable, "-m", "accelbench.cli", "--params", str(params), *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def _temporaries(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob(".*") if ".new." in p.name or p.name.endswith(".tmp")]


# --- prepare and download: a folder or file the user did not hand over ----------------------


def test_prepare_refuses_a_foreign_folder_and_a_file_untouched(fake_mnist, tmp_path) -> None:
    mirror, _ = fake_mnist
    home = tmp_path / "home"
    foreign = home / "data"
    (foreign / "photos").mkdir(parents=True)
    (foreign / "photos" / "cat.jpg").write_bytes(b"a cat")
    (foreign / "notes.txt").write_text("mine")
    sibling = home / ".data.backup"  # beside it: an older prepare removed `.data.*`
    sibling.mkdir()
    a_file = home / "results.csv"
    a_file.write_text("a,b\n1,2\n")
    before = _snapshot(home)

    for out in (foreign, a_file):
        result = _accelbench(tmp_path, "prepare", "--raw", str(mirror), "--out", str(out))
        assert result.returncode == 2, result.stderr
        [line] = result.stderr.splitlines()
        assert line.startswith(f"accelbench prepare: error: {out}: exists and is not a prepared")
        assert "pass a new path" in line
    assert _snapshot(home) == before and sibling.is_dir() and a_file.is_file()


def test_prepare_runs_again_over_its_own_folder_and_into_an_empty_one(
    prepared, fake_mnist, tmp_path
) -> None:
    mirror, checksums = fake_mnist
    mnist_data = DATASETS["mnist"]
    write = functools.partial(mnist.prepare_into, mirror, checksums=checksums)
    prepare(prepared, mnist_data, write)  # dvc repro's normal case, run by hand
    assert prepared_dataset(prepared) == mnist_data  # its manifest verifies
    empty = tmp_path / "empty"
    empty.mkdir()
    prepare(empty, mnist_data, write)
    assert (empty / MANIFEST).is_file()
    (prepared / "added.npy").write_bytes(b"the user's")  # no longer only prepare's files
    with pytest.raises(InputError, match=r"it holds added\.npy, which prepare did not write"):
        prepare(prepared, mnist_data, write)
    assert (prepared / "added.npy").read_bytes() == b"the user's"


def test_download_writes_into_a_folder_and_replaces_only_its_verified_files(tmp_path) -> None:
    mirror = shared_mnist()
    if mirror is None:
        pytest.skip("no MNIST mirror ($ACCELBENCH_MNIST_MIRROR)")
    out = tmp_path / "data"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / ".movie.mkv.part").write_bytes(b"a browser's download")  # not ours to clean up
    stem = "train-labels-idx1-ubyte"
    (out / f"{stem}.gz").write_bytes(b"the user's own file of that name")
    before = _snapshot(out)
    with pytest.raises(
        InputError, match=rf"{stem}\.gz: exists and is not MNIST's {stem}\.gz"
    ) as refused:
        mnist.download(out, [str(mirror)])
    # a damaged copy of its own file (a truncated download) has a way out that works
    assert "a damaged or partial copy of it: delete it, and the next run fetches it" in str(
        refused.value
    )
    assert _snapshot(out) == before  # refused before the first download
    (out / f"{stem}.gz").unlink()

    mnist.download(out, [str(mirror)])
    mnist.download(out, [str(mirror)])  # again, over its own verified files
    assert (out / "notes.txt").read_text() == "mine" and (out / ".movie.mkv.part").exists()
    assert len(list(out.glob("*.gz"))) == 4


# --- compare: links, hard links, a full disk ------------------------------------------------


def _workspace(root: Path, steady_epoch_s: float = 1.0) -> compare.CompareInputs:
    """env/ and metrics/cpu/ as the stages write them (one trained CPU variant)."""
    for device, facts in ENV.files().items():
        write_json(root / "env" / f"{device}.json", facts)
    files = MetricsFiles(root / "metrics" / "cpu")
    write_json(files.train_json, trained_summary(steady_epoch_s, device="cpu").to_json())
    epochs = [test_report.epoch(e, steady_epoch_s, 0.99) for e in (1, 2, 3)]
    write_epochs_csv(files.epochs_csv, epochs)
    scores = {str(d): ClassScores(0.99, 0.99, 0.99) for d in range(10)}
    write_json(files.eval_json, EvalSummary(0.99, 0.03, 0.99, 5000.0, scores).to_json())
    write_json(files.run_json, RunRecord("cpu", "trained", None).to_json())
    write_json(files.quantized_json, Skipped("not quantized in this test").to_json())
    return compare.select(small_params(variants=VARIANTS))


@pytest.fixture
def untracked(monkeypatch: pytest.MonkeyPatch) -> None:
    """compare in this process without an MLflow store: the files are what is tested."""
    for name in ("finish_pipeline", "log_variant_figures", "log_evaluation", "record_skipped"):
        monkeypatch.setattr(tracking, name, lambda *args, **kwargs: None)


def _compare(root: Path, inputs: compare.CompareInputs) -> None:
    compare.run(root, inputs, root / "env", root / "metrics", root / "reports")


@pytest.mark.slow
def test_compare_replaces_links_and_never_writes_through_them(
    tmp_path, untracked, mlflow_store
) -> None:
    """Symlinks to files outside the workspace and hard links into DVC's cache (`cache.type
    symlink` / `hardlink`) keep their content when compare runs again in a real process."""
    root = tmp_path / "workspace"
    _compare(root, _workspace(root))
    reports = root / "reports"
    outside, cache = tmp_path / "outside", tmp_path / "cache"
    outside.mkdir()
    cache.mkdir()
    linked = {}
    for i, name in enumerate(
        ["comparison.md", "summary.png", "comparison.json", "metrics/cpu.json", "plots/epochs.csv"]
    ):
        path = reports / name
        target = (outside if i % 2 else cache) / f"object{i}"
        target.write_bytes(path.read_bytes())
        path.unlink()
        if i % 2:
            path.symlink_to(target)
        else:
            os.link(target, path)  # as DVC's hardlink cache makes them
        linked[path] = (target, target.read_bytes())

    _workspace(root, steady_epoch_s=0.5)  # new results: a different report
    result = _accelbench(
        root, "compare", "--env", "env", "--metrics", "metrics", "--out", "reports"
    )
    assert result.returncode == 0, result.stderr
    for path, (target, content) in linked.items():
        assert target.read_bytes() == content, f"{target} was written through {path}"
        assert not path.is_symlink() and path.stat().st_ino != target.stat().st_ino
    assert (reports / "comparison.json").read_bytes() != linked[reports / "comparison.json"][1]
    assert _temporaries(root) == []


def test_compare_refuses_a_foreign_file_at_an_output_path(tmp_path, untracked) -> None:
    root = tmp_path
    inputs = _workspace(root)
    reports = root / "reports"
    (reports / "metrics").mkdir(parents=True)
    (reports / "comparison.json").write_text('{"my": "notes"}')
    (reports / "metrics" / "budget.json").write_text('{"owner": "finance"}')  # not a variant's
    before = _snapshot(reports)
    with pytest.raises(InputError, match=r"comparison\.json: exists and is a file, not a comp"):
        _compare(root, inputs)
    assert _snapshot(reports) == before and _temporaries(root) == []  # nothing written

    (reports / "comparison.json").unlink()
    # a variant the last report had, since removed from params.yaml; and a user's own figures,
    # numbers only like a variant's, that no report ever had
    write_json(reports / "metrics" / "gone.json", {"steady_epoch_s": 1.0})
    write_json(reports / "comparison.json", {"cpu": {"status": "trained"}, "gone": {"status": "x"}})
    write_json(reports / "metrics" / "paper.json", {"test_accuracy": 0.992})
    _compare(root, inputs)
    _compare(root, inputs)  # again, over its own outputs
    assert sorted(p.name for p in (reports / "metrics").iterdir()) == [
        "budget.json", "cpu.json", "paper.json"
    ]  # fmt: skip
    assert json.loads((reports / "metrics" / "budget.json").read_text()) == {"owner": "finance"}
    assert json.loads((reports / "metrics" / "paper.json").read_text()) == {"test_accuracy": 0.992}


@pytest.fixture
def small_disk(tmp_path: Path):
    """An 8 MiB tmpfs (needs root, or CAP_SYS_ADMIN; skipped elsewhere)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _fill(disk: Path, leave_bytes: int) -> None:
    """Fill `disk`, then free `leave_bytes`."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    os.truncate(filler, filler.stat().st_size - leave_bytes)


def test_a_full_disk_leaves_the_old_report_whole_and_no_temporaries(
    tmp_path, small_disk, untracked
) -> None:
    root = small_disk
    _compare(root, _workspace(root))
    reports = root / "reports"
    before = _snapshot(reports)
    assert "comparison.md" in before and "plots/per_class.csv" in before

    inputs = _workspace(root, steady_epoch_s=0.5)  # new results, and no room for them
    # room for the figure's temporary (about the same size), not for the files after it
    _fill(root, leave_bytes=len(before["summary.png"]) + 8 * 1024)
    with pytest.raises(OSError) as raised:
        _compare(root, inputs)
    assert raised.value.errno == errno.ENOSPC
    assert _snapshot(reports) == before  # all old, none half-written
    assert _temporaries(root) == []


def test_a_model_too_large_for_the_disk_is_a_full_disk(small_disk) -> None:
    """torch.save's own error on a full disk read "unexpected pos ... vs ..." (a bug report,
    to the CLI); it is the OSError it is, naming the file, and the old file stays whole."""
    import torch

    from accelbench.core.results import atomic_torch_save

    model = small_disk / "cpu.pt"
    atomic_torch_save({"weights": torch.zeros(16)}, model)
    before = model.read_bytes()
    with pytest.raises(OSError) as raised:
        atomic_torch_save({"weights": torch.zeros(4 << 20)}, model)  # 16 MiB on an 8 MiB disk
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(model)
    assert model.read_bytes() == before and _temporaries(small_disk) == []


# --- evaluate and quantize: refused before any work ------------------------------------------


def test_compare_refuses_another_variants_evaluation_in_a_folder(
    tmp_path, untracked, mlflow_store
) -> None:
    """`accelbench evaluate --model models/cpu.pt --metrics metrics/gpu` put cpu's figures in
    gpu's folder, and compare published them as gpu's (`dvc metrics show` too)."""
    root = tmp_path / "workspace"
    inputs = _workspace(root)
    run_json = root / "metrics" / "cpu" / "run.json"
    write_json(run_json, RunRecord("amp", "trained", None).to_json())
    with pytest.raises(InputError) as raised:
        _compare(root, inputs)
    assert str(raised.value).startswith(
        f"{run_json}: the evaluation of variant 'amp', in the folder of 'cpu'; evaluate 'cpu' "
        "again (`dvc repro evaluate@cpu`"
    )
    assert not (root / "reports").exists()  # refused before any output


def test_compare_leaves_a_removed_variants_timings_out_of_the_report(tmp_path, untracked) -> None:
    """The timings a removed variant's stages left in .accelbench/timings/ were listed as
    up-to-date stages of the pipeline."""
    from accelbench.core import phases
    from accelbench.core.phases import StageTiming

    root = tmp_path / "workspace"
    inputs = _workspace(root)
    for stage in ("train@cpu", "train@gone", "evaluate@gone"):
        phases.write(root, StageTiming(stage, 1000.0, 5.0, {"imports": 1.0}, 3.0))
    _compare(root, inputs)
    report = (root / "reports" / "comparison.md").read_text()
    assert "| train@cpu |" in report and "@gone" not in report


def test_compare_gives_a_train_stage_s_time_to_its_model_without_its_repeats(
    tmp_path, untracked
) -> None:
    """The report's and comparison.json's time to a saved model is the train stage's wall
    time less its repeats; the pipeline-time table keeps the stage's whole time."""
    from accelbench.core import phases
    from accelbench.core.phases import StageTiming

    root = tmp_path / "workspace"
    inputs = _workspace(root)
    timing = StageTiming("train@cpu", 1000.0, 12.5, {"training": 9.0}, 8.0, repeats_s=5.25)
    phases.write(root, timing)
    _compare(root, inputs)
    report = (root / "reports" / "comparison.md").read_text()
    comparison = json.loads((root / "reports" / "comparison.json").read_text())
    assert comparison["cpu"]["stage_to_model_s"] == pytest.approx(7.25)
    assert "| 7.250 s | 99.00% |" in report.split("\n\n## ")[0]  # the answer's table
    assert "its train stage 7.250 s from process start to a saved model" in report
    assert "| train@cpu | 12.5 s |" in report  # the pipeline-time table: the whole stage


def test_compare_refuses_a_trained_variant_without_epochs(tmp_path, untracked) -> None:
    """An epochs.csv emptied to its header was accepted: the cost read $0.0000."""
    root = tmp_path / "workspace"
    inputs = _workspace(root)
    epochs_csv = root / "metrics" / "cpu" / "epochs.csv"
    epochs_csv.write_text(epochs_csv.read_text().splitlines()[0] + "\n")
    with pytest.raises(InputError, match=r"epochs\.csv: no epochs, though train\.json says"):
        _compare(root, inputs)
    assert not (root / "reports").exists()


def test_quantize_refuses_a_foreign_file_before_loading_anything(tmp_path) -> None:
    files = MetricsFiles(tmp_path / "metrics")
    files.folder.mkdir()
    files.quantized_json.write_text("my own quantization notes")
    with pytest.raises(InputError, match=r"quantized\.json: exists and is a file, not a results"):
        quantize.run(
            tmp_path,
            quantize.select(small_params()),
            tmp_path / "no-model.pt",  # never opened: the refusal comes first
            tmp_path / "prepared",
            files,
        )
    assert files.quantized_json.read_text() == "my own quantization notes"


@pytest.mark.slow
def test_the_cli_names_the_file_an_output_folder_would_replace(tmp_path) -> None:
    a_file = tmp_path / "reports"
    a_file.write_text("not a folder")
    result = _accelbench(tmp_path, "env", "--out", str(a_file))
    assert result.returncode == 2 and a_file.read_text() == "not a folder"
    [line] = result.stderr.splitlines()
    assert line == (
        f"accelbench env: error: {a_file}: exists and is a file, not a folder; accelbench "
        "writes its outputs into a folder: move it away or pass another path"
    )
    devnull = _accelbench(tmp_path, "download", "--out", "/dev/null")
    assert devnull.returncode == 2
    assert "/dev/null: exists and is a special file, not a folder" in devnull.stderr
    assert "mirrors in order" not in devnull.stderr  # refused before anything is tried


def test_a_fifo_at_the_params_file_is_refused_unopened(tmp_path) -> None:
    """`accelbench check` opened it to read and waited for a writer, silent, for ever."""
    fifo = tmp_path / "params.yaml"
    os.mkfifo(fifo)
    command = [sys.executable, "-m", "accelbench.cli", "--params", str(fifo), "check"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.splitlines() == [
        f"accelbench check: error: {fifo}: is a special file (a FIFO, a device or a socket), "
        "not a params file; pass a regular YAML file"
    ]


@pytest.mark.parametrize("where", ["checkpoint", "models"])
def test_train_refuses_a_fifo_checkpoint_and_a_models_link_loop(tmp_path, prepared, where) -> None:
    """A FIFO at the checkpoint path was replaced by the first epoch's and so deleted; a
    `models/` linking to itself was `unexpected RuntimeError: Symlink loop … report it`."""
    checkpoint, models = tmp_path / "ck" / "cpu.pt", tmp_path / "models"
    checkpoint.parent.mkdir()
    os.mkfifo(checkpoint) if where == "checkpoint" else models.symlink_to("models")
    done = _accelbench(
        tmp_path, "train", "cpu", "--data", str(prepared), "--model", str(models / "cpu.pt"),
        "--metrics", str(tmp_path / "metrics"), "--checkpoint", str(checkpoint), "--quiet",
    )  # fmt: skip
    named = {
        "checkpoint": f"{checkpoint}: exists and is a special file, not a training checkpoint",
        "models": f"{models}: is a symbolic link loop, not a folder; accelbench writes",
    }
    [line] = done.stderr.splitlines()
    assert done.returncode == 2 and named[where] in line, line
    assert checkpoint.is_fifo() if where == "checkpoint" else models.is_symlink()


@pytest.mark.parametrize("damage", ["deflate", "truncated"])
def test_a_damaged_download_is_named_then_fetched_again(tmp_path, monkeypatch, damage) -> None:
    """Bytes flipped inside a verified .gz (a broken deflate stream) made prepare and download
    say "unexpected error: Error -3 while decompressing data … report it"; a truncated copy
    was refused by download, which left it to the user to delete."""
    mirror = shared_mnist()
    if mirror is None:
        pytest.skip("no MNIST mirror ($ACCELBENCH_MNIST_MIRROR)")
    monkeypatch.setenv(mnist.MIRROR_ENV, str(mirror))
    raw = tmp_path / "raw"
    raw.mkdir()
    for path in mirror.glob("*.gz"):
        (raw / path.name).write_bytes(path.read_bytes())
    damaged = raw / "train-images-idx3-ubyte.gz"
    content = damaged.read_bytes()
    flipped = content[:12] + bytes(b ^ 0xFF for b in content[12:20]) + content[20:]
    damaged.write_bytes(flipped if damage == "deflate" else content[: len(content) // 2])
    prepared = _accelbench(tmp_path, "prepare", "--raw", str(raw), "--out", str(tmp_path / "p"))
    [line] = prepared.stderr.splitlines()
    assert prepared.returncode == 2, line
    assert line.startswith(f"accelbench prepare: error: {damaged}: not a complete gzip file (")
    assert line.endswith("run `accelbench download` (or `dvc repro download`) again")
    fetched = _accelbench(tmp_path, "download", "--out", str(raw))
    assert fetched.returncode == 0, fetched.stderr
    assert f"download: {damaged} is a damaged copy (its gzip stream breaks: " in fetched.stderr
    assert damaged.read_bytes() == content
