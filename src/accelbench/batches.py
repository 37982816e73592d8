"""Batch sources: the dataset resident on the device, or the tutorials' DataLoader recipe.

Both draw their per-epoch order from `epoch_permutation(seed, epoch, n)`, which is computed
on the CPU from a seeded generator: the order is a function of the seed alone, identical
on every device and for both sources, so the variants train on the same batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from .data import Split
from .params import LoaderParams

# The tutorials' normalization (training-set mean/std of pixels in [0, 1]).
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081

Batch = tuple[torch.Tensor, torch.Tensor]


def epoch_permutation(seed: int, epoch: int, n: int) -> torch.Tensor:
    """The order of the n training samples in `epoch` (int64, CPU)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=generator)


def normalize_images(images: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """uint8 [n, 28, 28] -> normalized float32 [n, 1, 28, 28] on `device`."""
    tensor = torch.as_tensor(images).to(device)
    return ((tensor.float() / 255.0 - MNIST_MEAN) / MNIST_STD).unsqueeze(1)


class ResidentBatches:
    """The whole split on the training device, normalized once; batches are index gathers."""

    def __init__(
        self,
        split: Split,
        device: torch.device,
        batch_size: int,
        seed: int,
        *,
        shuffle: bool = True,
        channels_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.images = normalize_images(split.images, device)
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
        self.n = n

    def __iter__(self) -> Iterator[int]:
        order = epoch_permutation(self.seed, self.epoch, self.n)[: self.total_size]
        return iter(order[self.rank : self.total_size : self.num_replicas].tolist())


class LoaderBatches:
    """The tutorials' recipe: torchvision MNIST + ToTensor + Normalize through a DataLoader."""

    def __init__(
        self,
        torchvision_root: Path,
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
        from torchvision import datasets, transforms  # import cost only for this source

        dataset = datasets.MNIST(
            str(torchvision_root),
            train=True,
            download=False,
            transform=transforms.Compose(
                [transforms.ToTensor(), transforms.Normalize((MNIST_MEAN,), (MNIST_STD,))]
            ),
        )
        self.sampler = EpochSampler(min(num_samples, len(dataset)), seed, rank, world_size)
        workers = loader.num_workers
        self.loader = DataLoader(
            dataset,
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
        self.batch_size = batch_size

    @property
    def num_samples(self) -> int:
        return self.sampler.num_samples * self.sampler.num_replicas

    def __len__(self) -> int:
        return len(self.loader)

    def epoch(self, epoch: int) -> Iterator[Batch]:
        self.sampler.set_epoch(epoch)
        memory_format = torch.channels_last if self.channels_last else torch.preserve_format
        for images, labels in self.loader:
            yield (
                images.to(self.device, non_blocking=self.non_blocking, memory_format=memory_format),
                labels.to(self.device, non_blocking=self.non_blocking),
            )
