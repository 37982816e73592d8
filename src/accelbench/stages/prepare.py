"""prepare: decode and validate the IDX files into arrays (and torchvision's layout)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import data
from ..console import log
from ..params import Params


def select(params: Params) -> None:
    """No params: the files alone decide the arrays."""
    return None


def run(raw_dir: Path, out_dir: Path) -> dict[str, int]:
    counts = data.prepare(raw_dir, out_dir)
    log(f"prepare: {counts['train']} training and {counts['test']} test images")
    return counts


def main(args: argparse.Namespace, params: Params, root: Path) -> None:
    select(params)
    run(args.raw, args.out)
