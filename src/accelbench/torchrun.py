"""A DDP variant's processes: the stage re-launches itself under torchrun, and each child
joins the process group for the length of its training."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

from .console import StageError, log
from .params import DistributedParams
from .placement import Placement


def launch(name: str, cfg: DistributedParams, argv: list[str]) -> None:
    """Re-run this same `accelbench` command (`argv`) under torchrun, once per process."""
    if cfg.nnodes == 1:
        rendezvous = ["--standalone"]
    else:
        rendezvous = [
            f"--nnodes={cfg.nnodes}",
            f"--node-rank={cfg.node_rank}",
            "--rdzv-backend=static",
            f"--rdzv-endpoint={cfg.rdzv_endpoint}",
        ]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={cfg.nproc_per_node}",
        *rendezvous,
        "--max-restarts=0",
        "--monitor-interval=1",
        "-m",
        "accelbench.cli",
        *argv,
    ]
    log(f"train {name}: launching {cfg.world_size} processes: torchrun {' '.join(command[3:])}")
    result = subprocess.run(command, check=False)
    if result.returncode != 0:
        raise StageError(
            f"variant {name!r}: torchrun exited with {result.returncode}; its report above names "
            "the failed rank and its exit code or signal"
        )


@contextlib.contextmanager
def process_group(placement: Placement) -> Iterator[None]:
    """Inside: this torchrun child is in its process group (nothing, outside torchrun)."""
    if placement.backend is None:
        yield
        return
    import torch.distributed as dist

    dist.init_process_group(placement.backend)
    try:
        yield
    finally:
        dist.destroy_process_group()
