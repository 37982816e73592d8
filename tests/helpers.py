"""Helpers the tests share (fixtures live in conftest.py): fake MNIST, the repository's params
shrunk to test size, the `accelbench train` command, a small CPU training run."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from accelbench.core.params import Params, TrainParams, VariantParams, parse_params
from accelbench.core.results import EpochRecord
from accelbench.data import mnist
from accelbench.data.batches import ResidentBatches
from accelbench.data.datasets import DATASETS
from accelbench.data.prepared import load_split
from accelbench.training import engine
from accelbench.training.models import SeedCNN

REPO = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
FP32_CPU = VariantParams(device="cpu", precision="fp32")


# --- fake data -------------------------------------------------------------------------------


def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def synthetic_digits(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Learnable 28x28 images: class c is a bright bar at a class-specific place, plus noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=n).astype(np.uint8)
    images = rng.integers(0, 60, size=(n, 28, 28)).astype(np.uint8)
    for i, c in enumerate(labels):
        row = 3 + 2 * int(c)
        images[i, row : row + 2, 4:24] = 255
    return images, labels


def write_fake_mnist(folder: Path, n_train: int = 512, n_test: int = 256) -> dict[str, str]:
    """Four gzipped IDX files; returns {stem: sha256 of the decompressed content}."""
    folder.mkdir(parents=True, exist_ok=True)
    checksums = {}
    for prefix, n, seed in (("train", n_train, 1), ("t10k", n_test, 2)):
        images, labels = synthetic_digits(n, seed)
        for stem, payload in (
            (f"{prefix}-images-idx3-ubyte", idx_bytes(images, mnist.IMAGES_MAGIC)),
            (f"{prefix}-labels-idx1-ubyte", idx_bytes(labels, mnist.LABELS_MAGIC)),
        ):
            (folder / f"{stem}.gz").write_bytes(gzip.compress(payload, mtime=0))
            checksums[stem] = hashlib.sha256(payload).hexdigest()
    return checksums


def cifar10_batch(images: np.ndarray, labels: np.ndarray, label: str) -> bytes:
    """One batch as the official archive holds it: a pickled dict whose keys load as str with
    encoding latin1 (as torchvision loads them), data uint8 [n, 3072] (R, G, B planes), labels
    a list of ints."""
    import pickle

    batch = {
        "batch_label": label,
        "labels": [int(c) for c in labels],
        "data": images.reshape(len(images), -1),
        "filenames": [f"{i}.png" for i in range(len(images))],
    }
    return pickle.dumps(batch, protocol=2)


def write_fake_cifar10(
    folder: Path, n_per_batch: int = 64, n_test: int = 128, members: dict[str, bytes] | None = None
) -> str:
    """`cifar-10-python.tar.gz` in the official layout (cifar-10-batches-py/ with data_batch_1..5,
    test_batch, batches.meta) holding learnable 32x32 colour images; returns its MD5.
    `members` replaces or adds files of the archive."""
    import io
    import pickle
    import tarfile

    def colour_images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        digits, labels = synthetic_digits(n, seed)
        padded = np.zeros((n, 32, 32), np.uint8)
        padded[:, 2:30, 2:30] = digits
        return np.stack([padded, padded // 2, 255 - padded], axis=1), labels

    files = {}
    for i in range(1, 6):
        files[f"data_batch_{i}"] = cifar10_batch(*colour_images(n_per_batch, 10 + i), f"train {i}")
    files["test_batch"] = cifar10_batch(*colour_images(n_test, 20), "test")
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse",
             b"ship", b"truck"]  # fmt: skip
    files["batches.meta"] = pickle.dumps({"label_names": names}, protocol=2)
    files |= members or {}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "cifar-10-python.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for name, content in files.items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest()


def shared_mnist() -> Path | None:
    """The verified MNIST mirror: $ACCELBENCH_MNIST_MIRROR, else ../shared/datasets/mnist."""
    candidate = os.environ.get(mnist.MIRROR_ENV) or str(
        REPO.parent / "shared" / "datasets" / "mnist"
    )
    path = Path(candidate)
    return path if (path / "train-images-idx3-ubyte.gz").is_file() else None


# --- the repository's params, shrunk ---------------------------------------------------------

# Two epochs of batch 128 over the 512 fake images; shift_px 0: the synthetic digits encode
# their class by position.
SMALL = {"epochs": 2, "batch_size": 128, "eval_batch_size": 256, "shift_px": 0}


def repo_params_raw(variants: dict | None = None, **train: Any) -> dict:
    """params.yaml as a mapping, with some `train` values (and the variants) replaced: a
    `train` epochs or repeats holds for every variant, over a variant's own; a replaced
    variant set keeps only the report baselines and quantized variants that still
    name variants. One training per variant unless a test asks for more (`repeats=k`, or a
    variant's own `repeats`): the shipped train.repeats (3) tripled every test training."""
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["train"]["repeats"] = 1
    raw["train"].update(train)
    for key in {"epochs", "repeats"} & set(train):  # the test's size, for every variant
        for variant in raw["variants"].values():
            variant.pop(key, None)
    if variants is not None:
        raw["variants"] = variants
        report = raw.get("report", {})
        if report.get("speedup_baseline") not in variants:
            report.pop("speedup_baseline", None)
        report["scaling_baselines"] = {
            k: v for k, v in report.get("scaling_baselines", {}).items() if {k, v} <= set(variants)
        }
        quantize = raw.setdefault("quantize", {})
        quantize["variants"] = [v for v in quantize.get("variants", []) if v in variants]
    return raw


def small_params(variants: dict | None = None, **train: Any) -> Params:
    """The repository's params at test size (SMALL, then `train`), validated."""
    return parse_params(repo_params_raw(variants, **(SMALL | train)))


def write_params(folder: Path, variants: dict | None = None, **train: Any) -> Path:
    """`folder/params.yaml`: the repository's, with some `train` values (and variants) replaced."""
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(repo_params_raw(variants, **train)))
    return path


def train_command(
    params: Path,
    name: str,
    prepared: Path,
    model: Path,
    metrics: Path,
    checkpoint: Path | None = None,
) -> list[str]:
    """`accelbench train` as dvc.yaml runs it, in this interpreter."""
    command = [
        sys.executable, "-m", "accelbench.cli", "--params", str(params), "train", name,
        "--data", str(prepared), "--model", str(model), "--metrics", str(metrics), "--quiet",
    ]  # fmt: skip
    return command + (["--checkpoint", str(checkpoint)] if checkpoint else [])


# --- a small training run --------------------------------------------------------------------


def fit_small(
    prepared: Path,
    train: TrainParams,
    variant: VariantParams = FP32_CPU,
    device: torch.device = CPU,
    model: torch.nn.Module | None = None,
    *,
    accumulation_steps: int = 1,
    hooks: engine.FitHooks | None = None,
    resume_from: engine.TrainingState | None = None,
) -> tuple[torch.nn.Module, list[EpochRecord]]:
    """engine.fit on the fake data: seeded model (unless given), resident batches of
    `train.batch_size`, the test set in batches of 256."""
    if model is None:
        engine.seed_everything(train.seed)
        model = SeedCNN(dropout=train.dropout).to(device)
    mnist_data = DATASETS["mnist"]
    batches = ResidentBatches(
        load_split(prepared, "train"),
        mnist_data,
        device,
        train.batch_size,
        train.seed,
        channels_last=variant.channels_last,
    )
    test = ResidentBatches(load_split(prepared, "test"), mnist_data, device, 256, 0, shuffle=False)
    spec = engine.FitSpec(train, variant, device, accumulation_steps=accumulation_steps)
    return model, engine.fit(model, batches, test, spec, hooks or engine.FitHooks(), resume_from)


def cpu_train_command(folder: Path, prepared: Path, epochs: int) -> list[str]:
    """`accelbench train cpu` on the fake data, batch 64, writing into `folder`."""
    params = write_params(folder, epochs=epochs, batch_size=64)
    return train_command(params, "cpu", prepared, folder / "cpu.pt", folder / "metrics")


def mlflow_runs(store: str, name: str) -> list:
    """The runs named `name` in the accelbench experiment of the store at `store`."""
    from mlflow.tracking import MlflowClient

    from accelbench.system.tracking.store import EXPERIMENT

    client = MlflowClient(store)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is None:
        return []
    return client.search_runs([experiment.experiment_id], f"attributes.run_name = '{name}'")


def run_all_stages(root: Path, params: Params, prepared: Path) -> dict:
    """env, then train, evaluate and quantize of every variant, then compare, in this process."""
    from accelbench.core.outputs import MetricsFiles
    from accelbench.stages import compare, env, evaluate, quantize, train

    env.run(env.select(params), root / "env")
    for name in params.variants:
        out = train.TrainOutputs(
            root / "models" / f"{name}.pt", MetricsFiles(root / "metrics" / name)
        )
        train.run(root, name, train.select(params, name), prepared, out, quiet=True)
        evaluate.run(evaluate.select(params), out.model, prepared, out.metrics)
        if name in params.quantize.variants:
            quantize.run(root, quantize.select(params), out.model, prepared, out.metrics)
    return compare.run(
        root, compare.select(params), root / "env", root / "metrics", root / "reports"
    )


def trained_summary(steady_epoch_s: float | None, **fields: Any):
    """A TrainSummary of three epochs at `steady_epoch_s` (None: one epoch), the rest plausible."""
    from accelbench.core.results import TrainSummary

    values = {
        "epochs": 3, "first_epoch_s": 2 * (steady_epoch_s or 1), "steady_epoch_s": steady_epoch_s,
        "total_train_s": 4 * (steady_epoch_s or 1), "steady_samples_per_s": 60000 / (steady_epoch_s or 1),
        "data_wait_fraction": 0.01, "final_train_loss": 0.05, "final_test_accuracy": 0.99,
        "best_test_accuracy": 0.99, "nonfinite_steps": 0, "scaler_skipped_steps": None,
        "peak_gpu_mem_mib": None, "steady_gpu_energy_j_per_epoch": None,
        "accumulation_steps": 1, "device": "cuda", "device_name": "NVIDIA H200",
        "precision": "fp32", "batches": "resident", "world_size": 1, "train_samples": 60000,
        "flops_per_sample": 65_000_000, "steady_tflops": 1.0, "peak_tflops": None,
        "peak_share": None, "peak_host_rss_mib": 900.0, "steady_samples_per_s_per_process": None,
    }  # fmt: skip
    return TrainSummary(**(values | fields))


DVC = str(Path(sys.executable).parent / "dvc")


def dvc_repo(folder: Path) -> Path:
    """`folder/repo`: a new git and DVC repository holding this repository's dvc.yaml and
    params.yaml (and nothing else: add what the test reads)."""
    repo = folder / "repo"
    repo.mkdir()
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy2(REPO / name, repo / name)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([DVC, "init", "-q"], cwd=repo, check=True)
    return repo


def copy_repo(dest: Path) -> None:
    """The repository's files as git sees them (tracked and new), committed in a new repo at
    `dest`: a workspace a test can run `dvc repro` in."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in files:
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    for args in (
        ["init", "-q"],
        ["add", "-A"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy"],
    ):
        subprocess.run(["git", *args], cwd=dest, check=True, capture_output=True)


def load_script(path: Path):
    """A script or tool that is not a package module (benchmarks/, tools/, docker/), by path;
    registered in sys.modules under its name (dataclasses look their module up there), where
    it stays for the session: loading the same path again replaces it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module
