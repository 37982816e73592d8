"""The datasets the pipeline trains on, as one spec carried from params.yaml to the model.

`params.data.dataset` names one; `by_name` turns the name into its `Dataset`, once, at the
stage; every layer below takes the `Dataset`, never a name with a default. Adding a dataset
is an entry here, its module in this package (download and decode; the download and prepare
stages' tables name its functions), and its model in `training.models`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from accelbench.core.console import InputError


@dataclass(frozen=True)
class Split:
    images: np.ndarray  # uint8 [n, 28, 28] (MNIST) or [n, 3, 32, 32] (CIFAR-10)
    labels: np.ndarray  # uint8 [n]


def save_splits(out_dir: Path, splits: Mapping[str, Split]) -> dict[str, int]:
    """Each split as `<split>_images.npy` and `<split>_labels.npy` (what a prepared folder
    holds); returns the samples per split."""
    for split, arrays in splits.items():
        np.save(out_dir / f"{split}_images.npy", arrays.images)
        np.save(out_dir / f"{split}_labels.npy", arrays.labels)
    return {split: len(arrays.labels) for split, arrays in splits.items()}


@dataclass(frozen=True)
class Dataset:
    """What the stages need to know of a dataset: its samples' shape, their normalization,
    and which prepared files identify each split."""

    name: str
    sample_shape: tuple[int, ...]  # one image as prepared (uint8): (28, 28) or (3, 32, 32)
    mean: float  # per channel, of pixels in [0, 1] (one value: the same for every channel)
    std: float
    # Per split, the prepared files whose SHA-256 (from the manifest) identify it: its digest
    # in MLflow. MNIST's are its decompressed IDX files, whose SHA-256 are the official ones.
    digest_files: Mapping[str, tuple[str, ...]] = field(compare=False)

    @property
    def channels(self) -> int:
        return 1 if len(self.sample_shape) == 2 else self.sample_shape[0]

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """One normalized image as the model takes it: (channels, height, width)."""
        return (self.channels, *self.sample_shape[-2:])


DATASETS = {
    # the tutorials' normalization: the training set's pixel mean and std
    "mnist": Dataset(
        "mnist",
        (28, 28),
        0.1307,
        0.3081,
        digest_files={
            "train": ("MNIST/raw/train-images-idx3-ubyte", "MNIST/raw/train-labels-idx1-ubyte"),
            "test": ("MNIST/raw/t10k-images-idx3-ubyte", "MNIST/raw/t10k-labels-idx1-ubyte"),
        },
    ),
    # the DDP/AMP tutorial's: Normalize((0.5,)*3, (0.5,)*3)
    "cifar10": Dataset(
        "cifar10",
        (3, 32, 32),
        0.5,
        0.5,
        digest_files={
            split: (f"{split}_images.npy", f"{split}_labels.npy") for split in ("train", "test")
        },
    ),
}


def by_name(name: str) -> Dataset:
    """The dataset called `name`; an unknown name is an input error listing the known ones."""
    if name not in DATASETS:
        raise InputError(f"unknown dataset {name!r} (known: {', '.join(DATASETS)})")
    return DATASETS[name]
