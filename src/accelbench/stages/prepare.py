"""prepare: decode and validate the raw files into arrays (and torchvision's layout), with a
manifest that names the dataset."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from accelbench.core.console import log
from accelbench.core.params import Params
from accelbench.data import cifar10, mnist, prepared
from accelbench.data.datasets import Dataset, by_name


@dataclass(frozen=True)
class PrepareInputs:
    dataset: Dataset
    cifar10_md5: str  # the archive is checked again (a file swapped after download is refused)


def select(params: Params) -> PrepareInputs:
    return PrepareInputs(by_name(params.data.dataset), params.data.cifar10_md5)


# Each dataset's decoder (datasets.DATASETS names them): its raw files, as download wrote
# them, into the arrays of a new prepared folder; returns the samples per split.
DECODERS: dict[str, Callable[[Path, Path, PrepareInputs], Mapping[str, int]]] = {
    "mnist": lambda raw, folder, inputs: mnist.prepare_into(raw, folder),
    "cifar10": lambda raw, folder, inputs: cifar10.prepare_into(raw, folder, inputs.cifar10_md5),
}


def run(raw_dir: Path, out_dir: Path, inputs: PrepareInputs) -> dict[str, int]:
    decode = DECODERS[inputs.dataset.name]
    counts = prepared.prepare(
        out_dir, inputs.dataset, lambda folder: decode(raw_dir, folder, inputs)
    )
    name = inputs.dataset.name
    log(f"prepare: {name}: {counts['train']} training and {counts['test']} test images")
    return counts


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--raw", type=Path, required=True, help="the downloaded files")
    parser.add_argument("--out", type=Path, required=True, help="folder for the arrays")


def main(args: argparse.Namespace, params: Params, root: Path) -> None:
    run(args.raw, args.out, select(params))
