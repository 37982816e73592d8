"""A DDP variant's processes: the stage re-launches itself under torchrun, and each child
joins the process group for the length of its training.

None outlives the stage: torchrun runs as `python -m accelbench.training.torchrun`, which
ends it when the stage ends, and its workers end with it; an interrupted stage stops
torchrun, which stops its workers, before it unwinds. Nothing waits without bound: every
collective and the leaving barrier have `distributed.timeout_s`, and the process group's
teardown has `SHUTDOWN_LIMIT_S`, after which the rank says so in one line and ends.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

from accelbench.core.console import StageError, log
from accelbench.core.params import DistributedParams
from accelbench.system import lifetime
from accelbench.training.placement import Placement

# torchrun gives its workers 30 s to end after a signal before it kills them.
STOP_TIMEOUT_S = 40
SHUTDOWN_LIMIT_S = 30  # for destroy_process_group, once every rank is done


def launch(
    name: str, cfg: DistributedParams, argv: list[str], keep_fds: tuple[int, ...] = ()
) -> None:
    """Re-run this same `accelbench` command (`argv`) under torchrun, once per process;
    torchrun inherits `keep_fds` (the stage's locks: held until torchrun has ended)."""
    rendezvous = ["--standalone"]
    if cfg.nnodes > 1:
        rendezvous = [f"--nnodes={cfg.nnodes}", f"--node-rank={cfg.node_rank}"]
        rendezvous += ["--rdzv-backend=static", f"--rdzv-endpoint={cfg.rdzv_endpoint}"]
    options = [f"--nproc-per-node={cfg.nproc_per_node}", *rendezvous, "--max-restarts=0"]
    torchrun_args = [*options, "--monitor-interval=1", "-m", "accelbench.cli", *argv]
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
    process.terminate()  # SIGTERM; a no-op once the process has ended
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
def process_group(placement: Placement, cfg: DistributedParams | None) -> Iterator[None]:
    """Inside: this torchrun child is in its process group (nothing, outside torchrun).

    Leaving, the ranks first wait for each other (rank 0 writes the outputs while the others
    are done), then every CUDA graph and kernel that holds the communicator is finished and
    freed before the group is destroyed: a captured NCCL collective keeps its communicator
    alive, and destroying the group under a live graph can wait forever."""
    if placement.backend is None or cfg is None:
        yield
        return
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=cfg.timeout_s)
    device = placement.device if placement.device.type == "cuda" else None
    dist.init_process_group(placement.backend, timeout=timeout, device_id=device)
    finished = False
    try:
        yield
        finished = True
        dist.barrier()  # bounded by `timeout`, like every collective of this group
    finally:
        # A failing rank leaves its group as it is: its peers may never answer a teardown,
        # and the process is about to end with its own error, which must reach the user.
        if finished:
            _release_device(placement)
            _destroy_within(SHUTDOWN_LIMIT_S, placement.rank)


def _release_device(placement: Placement) -> None:
    """Free what the training left holding the communicator (CUDA graphs that captured its
    collectives, in reference cycles until collected; a compiled step's code and Inductor's
    CUDA graph trees, kept by Dynamo until reset) and wait for the GPU's queued work."""
    dynamo = sys.modules.get("torch._dynamo")  # imported only where a step was compiled
    if dynamo is not None:
        dynamo.reset()
    gc.collect()
    if placement.device is not None and placement.device.type == "cuda":
        import torch

        torch.cuda.synchronize(placement.device)


def _destroy_within(limit_s: float, rank: int) -> None:
    """destroy_process_group, or, when it has not returned in `limit_s`, one line and the end
    of this process, with success: every rank got here, and rank 0 wrote every output."""
    import torch.distributed as dist

    done = threading.Event()

    def destroy() -> None:
        dist.destroy_process_group()
        done.set()

    threading.Thread(target=destroy, name="destroy_process_group", daemon=True).start()
    if done.wait(limit_s):
        return
    log(
        f"rank {rank}: the process group did not shut down within {limit_s:.0f} s "
        "(destroy_process_group waiting on the communicator); ending this process"
    )
    lifetime.end_now(0)


def _main() -> None:
    """`python -m accelbench.training.torchrun ARGS`: torchrun ARGS, ended with the stage that
    started it; its workers end with it."""
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
