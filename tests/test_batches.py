"""batches.py: the resident and DataLoader sources give the same seeded batches, and each
process's share of a global batch is its slice of it."""

from __future__ import annotations

import multiprocessing

import numpy as np
import torch

from accelbench.core.params import LoaderParams
from accelbench.data.batches import (
    EpochSampler,
    LoaderBatches,
    ResidentBatches,
    epoch_permutation,
    normalize_images,
    zero_pixel,
)
from accelbench.data.datasets import DATASETS
from accelbench.data.prepared import load_split
from helpers import CPU

MNIST = DATASETS["mnist"]


def test_resident_source_yields_every_sample_once_in_a_seeded_order(prepared) -> None:
    split = load_split(prepared, "train")
    source = ResidentBatches(split, MNIST, CPU, 100, seed=5)
    labels = torch.cat([y for _, y in source.epoch(0)])
    images = torch.cat([x for x, _ in source.epoch(0)])
    assert len(labels) == 512 and len(source) == 6
    order = epoch_permutation(5, 0, 512)
    assert torch.equal(labels, torch.as_tensor(split.labels).long()[order])
    assert sorted(order.tolist()) == list(range(512))
    # the order is a function of (seed, epoch) alone
    assert torch.equal(epoch_permutation(5, 0, 512), order)
    assert not torch.equal(epoch_permutation(5, 1, 512), order)
    assert not torch.equal(epoch_permutation(6, 0, 512), order)
    assert images.shape == (512, 1, 28, 28)
    assert abs(images.mean().item()) < 3  # normalized, not raw 0..255


def test_dataloader_source_matches_resident_batches(prepared) -> None:
    split = load_split(prepared, "train")
    resident = ResidentBatches(split, MNIST, CPU, 128, seed=1)
    loader = LoaderBatches(
        prepared,
        MNIST,
        512,
        CPU,
        128,
        1,
        LoaderParams(num_workers=0, pin_memory=False, persistent_workers=False),
    )
    for epoch in (0, 1):
        for (xa, ya), (xb, yb) in zip(resident.epoch(epoch), loader.epoch(epoch), strict=True):
            assert torch.equal(ya, yb)
            torch.testing.assert_close(xa, xb)


def test_closing_the_dataloader_source_ends_its_persistent_workers_at_once(prepared) -> None:
    others = set(multiprocessing.active_children())  # another test's, still ending
    params = LoaderParams(num_workers=2, pin_memory=False, persistent_workers=True)
    loader = LoaderBatches(prepared, MNIST, 512, CPU, 128, 1, params)
    for epoch in (0, 1):
        assert sum(len(labels) for _, labels in loader.epoch(epoch)) == 512
    workers = set(multiprocessing.active_children()) - others
    assert len(workers) == 2  # persistent: alive after the last epoch, until closed
    loader.close()
    assert not any(w.is_alive() for w in workers)
    assert all(w.exitcode == 0 for w in workers)  # ended, not killed
    loader.close()  # twice is harmless


def test_shards_of_each_global_batch_cover_it_exactly(prepared) -> None:
    n, global_batch = 512, 64
    single = list(EpochSampler(n, seed=3))
    ranks = [list(EpochSampler(n, seed=3, rank=r, world_size=2)) for r in range(2)]
    local = global_batch // 2
    for k in range(n // global_batch):
        together = ranks[0][k * local : (k + 1) * local] + ranks[1][k * local : (k + 1) * local]
        assert sorted(together) == sorted(single[k * global_batch : (k + 1) * global_batch])
    split = load_split(prepared, "train")
    cpu = torch.device("cpu")
    whole = [y for _, y in ResidentBatches(split, MNIST, cpu, 64, 3).epoch(0)]
    halves = [
        [y for _, y in ResidentBatches(split, MNIST, cpu, 64, 3, rank=r, world_size=2).epoch(0)]
        for r in range(2)
    ]
    for k, batch in enumerate(whole):
        assert torch.equal(torch.cat([halves[0][k], halves[1][k]]), batch)


def test_a_black_pixel_normalizes_to_what_augmentation_pads_with() -> None:
    for dataset in DATASETS.values():
        black = np.zeros((1, *dataset.sample_shape), np.uint8)
        padding = torch.full((1, *dataset.input_shape), zero_pixel(dataset))
        torch.testing.assert_close(normalize_images(black, dataset, CPU), padding)
