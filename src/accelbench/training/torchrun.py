"""A DDP variant's processes: the stage re-launches itself under torchrun, and each child
joins the process group for the length of its training.

None outlives the stage: torchrun runs as `python -m accelbench.training.torchrun`, which ends it
(SIGTERM) when the stage ends, and its workers end with it (`lifetime.end_with_launcher`);
an interrupted stage stops torchrun, which stops its workers, before it unwinds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

from accelbench.core.console import StageError, log
from accelbench.core.params import DistributedParams
from accelbench.system import lifetime
from accelbench.training.placement import Placement

# torchrun gives its workers 30 s to end after a signal before it kills them.
STOP_TIMEOUT_S = 40


def launch(
    name: str, cfg: DistributedParams, argv: list[str], keep_fds: tuple[int, ...] = ()
) -> None:
    """Re-run this same `accelbench` command (`argv`) under torchrun, once per process;
    torchrun inherits `keep_fds` (the stage's locks: held until torchrun has ended)."""
    if cfg.nnodes == 1:
        rendezvous = ["--standalone"]
    else:
        rendezvous = [
            f"--nnodes={cfg.nnodes}",
            f"--node-rank={cfg.node_rank}",
            "--rdzv-backend=static",
            f"--rdzv-endpoint={cfg.rdzv_endpoint}",
        ]
    torchrun_args = [
        f"--nproc-per-node={cfg.nproc_per_node}",
        *rendezvous,
        "--max-restarts=0",
        "--monitor-interval=1",
        "-m",
        "accelbench.cli",
        *argv,
    ]
    log(f"train {name}: launching {cfg.world_size} processes: torchrun {' '.join(torchrun_args)}")
    env = {**os.environ, lifetime.PARENT_ENV: str(os.getpid())}
    command = [sys.executable, "-m", "accelbench.training.torchrun", *torchrun_args]
    process = subprocess.Popen(command, env=env, pass_fds=keep_fds)
    try:
        returncode = process.wait()
    except BaseException as exc:  # SIGTERM or Ctrl-C in the stage: torchrun stops its workers
        # Ctrl-C reached torchrun too (one process group): a second signal would cut short
        # its own shutdown of the workers
        ctrl_c = isinstance(exc, KeyboardInterrupt) and not exc.args
        _stop(process, signalled=ctrl_c)
        raise
    if returncode != 0:
        raise StageError(
            f"variant {name!r}: torchrun exited with {returncode}; its report above names "
            "the failed rank and its exit code or signal"
        )


def _stop(process: subprocess.Popen, signalled: bool) -> None:
    """End torchrun as a scheduler would: SIGTERM (unless it was `signalled` already), which it
    passes on to its workers, waiting for them; SIGKILL after STOP_TIMEOUT_S (its workers
    then end with it)."""
    if signalled and _ended(process, STOP_TIMEOUT_S):
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    if not _ended(process, STOP_TIMEOUT_S):
        process.kill()
        process.wait()


def _ended(process: subprocess.Popen, timeout_s: float) -> bool:
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return False
    return True


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


def _main() -> None:
    """`python -m accelbench.training.torchrun ARGS`: torchrun ARGS, ended with the stage that started
    it; its workers end with it."""
    lifetime.end_with_parent(int(os.environ[lifetime.PARENT_ENV]))
    os.environ[lifetime.PARENT_ENV] = str(os.getpid())
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main

    try:
        main()
    except SignalException as exc:  # it has stopped its workers; its traceback adds nothing
        raise SystemExit(128 + exc.sigval) from None


if __name__ == "__main__":
    _main()
