"""download: fetch and verify the dataset's files (MNIST's four, or CIFAR-10's archive),
mirror by mirror."""

from __future__ import annotations

import argparse
from pathlib import Path

from accelbench.core.console import log
from accelbench.core.params import DataParams, Params
from accelbench.data import mnist as data


def select(params: Params) -> DataParams:
    return params.data


def run(inputs: DataParams, out_dir: Path) -> list[Path]:
    limits = {
        "timeout_s": inputs.timeout_s,
        "retries": inputs.retries,
        "deadline_s": inputs.deadline_s,
    }
    if inputs.dataset == "cifar10":
        from accelbench.data import cifar10

        mirrors = data.mirrors_with_override(inputs.cifar10_mirrors, variable=cifar10.MIRROR_ENV)
        log(f"download: CIFAR-10 mirrors in order: {', '.join(mirrors)}")
        paths = cifar10.download(out_dir, mirrors, inputs.cifar10_md5, **limits)
    else:
        mirrors = data.mirrors_with_override(inputs.mirrors)
        log(f"download: mirrors in order: {', '.join(mirrors)}")
        paths = data.download_mnist(out_dir, mirrors, **limits)
    for path in paths:
        log(f"download: {path.name} verified")
    return paths


def main(args: argparse.Namespace, params: Params, root: Path) -> None:
    run(select(params), args.out)
