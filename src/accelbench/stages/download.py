"""download: fetch and verify the four MNIST files, mirror by mirror."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import data
from ..console import log
from ..params import DataParams, Params


def select(params: Params) -> DataParams:
    return params.data


def run(inputs: DataParams, out_dir: Path) -> list[Path]:
    mirrors = data.mirrors_with_override(inputs.mirrors)
    log(f"download: mirrors in order: {', '.join(mirrors)}")
    paths = data.download_mnist(
        out_dir,
        mirrors,
        timeout_s=inputs.timeout_s,
        retries=inputs.retries,
        deadline_s=inputs.deadline_s,
    )
    for path in paths:
        log(f"download: {path.name} verified")
    return paths


def main(args: argparse.Namespace, params: Params, root: Path) -> None:
    run(select(params), args.out)
