"""prepare: decode and validate the raw files into arrays (and torchvision's layout), with a
manifest that names the dataset."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from accelbench.core.console import log
from accelbench.core.params import Params
from accelbench.data import mnist as data


@dataclass(frozen=True)
class PrepareInputs:
    dataset: str
    cifar10_md5: str  # the archive is checked again (a file swapped after download is refused)


def select(params: Params) -> PrepareInputs:
    return PrepareInputs(params.data.dataset, params.data.cifar10_md5)


def run(raw_dir: Path, out_dir: Path, inputs: PrepareInputs) -> dict[str, int]:
    if inputs.dataset == "cifar10":
        from accelbench.data import cifar10

        def decode(raw: Path, out: Path) -> dict[str, int]:
            return cifar10.prepare_into(raw, out, inputs.cifar10_md5)

        counts = data.prepare(raw_dir, out_dir, None, "cifar10", decode)
    else:
        counts = data.prepare(raw_dir, out_dir)
    log(f"prepare: {inputs.dataset}: {counts['train']} training and {counts['test']} test images")
    return counts


def main(args: argparse.Namespace, params: Params, root: Path) -> None:
    run(args.raw, args.out, select(params))
