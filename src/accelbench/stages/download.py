"""download: fetch and verify the dataset's raw files (MNIST's four, or CIFAR-10's archive),
mirror by mirror."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from accelbench.core.console import log
from accelbench.core.params import DataParams, Params
from accelbench.data import cifar10, mnist
from accelbench.data.datasets import by_name
from accelbench.data.download import mirrors_with_override, output_folder


def select(params: Params) -> DataParams:
    return params.data


# The download limits every dataset's code takes, as params.data names them.
LIMITS = {"timeout_s", "retries", "deadline_s"}


def _mnist(inputs: DataParams, out_dir: Path) -> list[Path]:
    mirrors = mirrors_with_override(inputs.mirrors, mnist.MIRROR_ENV, "the four MNIST .gz files")
    log(f"download: mirrors in order: {', '.join(mirrors)}")
    return mnist.download(out_dir, mirrors, **inputs.model_dump(include=LIMITS))


def _cifar10(inputs: DataParams, out_dir: Path) -> list[Path]:
    mirrors = mirrors_with_override(inputs.cifar10_mirrors, cifar10.MIRROR_ENV, cifar10.ARCHIVE)
    log(f"download: CIFAR-10 mirrors in order: {', '.join(mirrors)}")
    limits = inputs.model_dump(include=LIMITS)
    return cifar10.download(out_dir, mirrors, inputs.cifar10_md5, **limits)


# Each dataset's download (datasets.DATASETS names them), with its params.data settings.
DOWNLOADS: dict[str, Callable[[DataParams, Path], list[Path]]] = {
    "mnist": _mnist,
    "cifar10": _cifar10,
}


def run(inputs: DataParams, out_dir: Path) -> list[Path]:
    """The dataset's raw files in `out_dir`, each logged as verified: fetched, or kept."""
    output_folder(out_dir)  # refused before the mirrors are named: nothing is tried
    return DOWNLOADS[by_name(inputs.dataset).name](inputs, out_dir)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="folder for the raw files")


def main(args: argparse.Namespace, params: Params, root: Path) -> None:
    run(select(params), args.out)
