"""Batch sources: the dataset resident on the device, or the tutorials' DataLoader recipe.

Both draw their per-epoch order from `epoch_permutation(seed, epoch, n)`, which is computed
on the CPU from a seeded generator: the order is a function of the seed alone, identical
on every device and for both sources, so the variants train on the same batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from accelbench.core.params import LoaderParams
from accelbench.data.datasets import Dataset, Split

Batch = tuple[torch.Tensor, torch.Tensor]  # images [n, channels, height, width], labels [n]


class Batches(Protocol):
    """A source of batches, epoch by epoch: `ResidentBatches` or `LoaderBatches`."""

    dataset: Dataset  # its images are normalized with this dataset's mean and std
    seed: int  # each epoch's order is drawn from it (a repeat at another seed sets it)

    @property
    def num_samples(self) -> int: ...

    def __len__(self) -> int: ...  # batches per epoch

    def epoch(self, epoch: int) -> Iterator[Batch]: ...

    def close(self) -> None: ...  # once its last epoch is done: what it runs beside ends


def epoch_permutation(seed: int, epoch: int, n: int) -> torch.Tensor:
    """The order of the n training samples in `epoch` (int64, CPU)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=generator)


def normalize_images(
    images: np.ndarray | torch.Tensor, dataset: Dataset, device: torch.device
) -> torch.Tensor:
    """`dataset`'s prepared images (uint8 [n, *sample_shape]) -> normalized float32
    [n, channels, height, width] on `device`, with the dataset's mean and std."""
    tensor = torch.as_tensor(images).to(device)
    return ((tensor.float() / 255.0 - dataset.mean) / dataset.std).reshape(-1, *dataset.input_shape)


def zero_pixel(dataset: Dataset) -> float:
    """A black pixel of `dataset`, normalized (what augmentation pads a shifted image with)."""
    return -dataset.mean / dataset.std


class ResidentBatches:
    """The whole split on the training device, normalized once; batches are index gathers."""

    def __init__(
        self,
        split: Split,
        dataset: Dataset,
        device: torch.device,
        batch_size: int,
        seed: int,
        *,
        shuffle: bool = True,
        channels_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.dataset = dataset
        self.images = normalize_images(split.images, dataset, device)
        if channels_last:
            self.images = self.images.contiguous(memory_format=torch.channels_last)
        self.labels = torch.as_tensor(split.labels).to(device).long()
        self.device = device
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.rank, self.world_size = rank, world_size

    @property
    def num_samples(self) -> int:
        return len(self.labels)

    def __len__(self) -> int:
        return -(-self.num_samples // self.batch_size)

    def epoch(self, epoch: int) -> Iterator[Batch]:
        n, bs = self.num_samples, self.batch_size
        if not self.shuffle:
            for start in range(0, n, bs):
                yield self.images[start : start + bs], self.labels[start : start + bs]
            return
        order = epoch_permutation(self.seed, epoch, n).to(self.device, non_blocking=True)
        for start in range(0, n, bs):
            index = order[start : start + bs]
            if self.world_size > 1:  # this process's share of the global batch
                index = index.tensor_split(self.world_size)[self.rank]
            yield self.images.index_select(0, index), self.labels.index_select(0, index)

    def close(self) -> None:
        """Nothing runs beside resident batches."""


class EpochSampler(DistributedSampler):
    """torch's DistributedSampler over the first n samples, in `epoch_permutation` order.

    Process r takes positions r, r + W, r + 2W, ... of the permutation, so with a per-process
    batch of B / W the W processes' k-th batches together are the single-process k-th batch.
    With one process it is a plain seeded shuffle. Call `set_epoch` before each epoch.
    """

    def __init__(self, n: int, seed: int, rank: int = 0, world_size: int = 1) -> None:
        super().__init__(
            range(n), num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
        )

    def __iter__(self) -> Iterator[int]:
        order = epoch_permutation(self.seed, self.epoch, len(self.dataset))[: self.total_size]
        return iter(order[self.rank : self.total_size : self.num_replicas].tolist())


def _torchvision_dataset(root: Path, dataset: Dataset, transform: object) -> object:
    """torchvision's training set of `dataset` over the prepared folder (its layout is there)."""
    from torchvision import datasets

    if dataset.name == "mnist":
        return datasets.MNIST(str(root), train=True, download=False, transform=transform)

    class PreparedCIFAR10(datasets.CIFAR10):
        """The prepared batch files: the manifest verified them and `prepare` decoded them with
        the data-only unpickler; torchvision's per-file MD5s would refuse a test archive."""

        def _check_integrity(self) -> bool:
            return True

        def _load_meta(self) -> None:
            self.classes = [str(label) for label in range(10)]
            self.class_to_idx = {name: i for i, name in enumerate(self.classes)}

    return PreparedCIFAR10(str(root), train=True, download=False, transform=transform)


class LoaderBatches:
    """The tutorials' recipe: torchvision's dataset + ToTensor + Normalize through a DataLoader."""

    def __init__(
        self,
        torchvision_root: Path,
        dataset: Dataset,
        num_samples: int,
        device: torch.device,
        batch_size: int,
        seed: int,
        loader: LoaderParams,
        *,
        channels_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        from torchvision import transforms  # import cost only for this source

        channels = dataset.channels
        normalize = transforms.Normalize((dataset.mean,) * channels, (dataset.std,) * channels)
        samples = _torchvision_dataset(
            torchvision_root, dataset, transforms.Compose([transforms.ToTensor(), normalize])
        )
        self.dataset = dataset
        self.sampler = EpochSampler(min(num_samples, len(samples)), seed, rank, world_size)
        workers = loader.num_workers
        self.loader = DataLoader(
            samples,
            batch_size=batch_size // world_size,
            sampler=self.sampler,
            num_workers=workers,
            pin_memory=loader.pin_memory and device.type == "cuda",
            persistent_workers=loader.persistent_workers and workers > 0,
            prefetch_factor=loader.prefetch_factor if workers > 0 else None,
        )
        self.device = device
        self.non_blocking = loader.pin_memory and device.type == "cuda"
        self.channels_last = channels_last

    @property
    def num_samples(self) -> int:
        return self.sampler.num_samples * self.sampler.num_replicas

    @property
    def seed(self) -> int:
        return self.sampler.seed

    @seed.setter
    def seed(self, seed: int) -> None:
        self.sampler.seed = seed

    def __len__(self) -> int:
        return len(self.loader)

    def close(self) -> None:
        """End the persistent workers now, through the DataLoader's own shutdown as Lightning
        does (it has no public call): left to the process's exit, with pinned memory, they kept
        a finished H200 stage alive for 20 s (docs/results/2026-12-04-h200-cold-compile.md)."""
        iterator, self.loader._iterator = self.loader._iterator, None
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()

    def epoch(self, epoch: int) -> Iterator[Batch]:
        self.sampler.set_epoch(epoch)
        memory_format = torch.channels_last if self.channels_last else torch.preserve_format
        for images, labels in self.loader:
            yield (
                images.to(self.device, non_blocking=self.non_blocking, memory_format=memory_format),
                labels.to(self.device, non_blocking=self.non_blocking),
            )
