"""Runs whose process died without ending them (kill -9, the OOM killer) are closed as
KILLED by the next run that meets them, tagged with why. Each run carries the machine, the pid
and the start of the process that has it open; one whose process is gone here is dead.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path

import psutil
from mlflow.tracking import MlflowClient

from accelbench.core.console import log
from accelbench.system.tracking.store import ROLE_TAG

HOST_TAG = "accelbench.host"
MACHINE_TAG = "accelbench.boot_id"  # the running kernel: the host and its containers share it
PID_TAG = "accelbench.pid"  # the process that has the run open, and its start (opaque),
PID_START_TAG = "accelbench.pid_start"  # so that a reused pid is not mistaken for it
CLOSED_TAG = "accelbench.closed"  # why a rerun ended a run its killed process left RUNNING
BY_HAND_TAG = "accelbench.by_hand"  # "true" on the pipeline run of a stage run by hand


def machine_id() -> str:
    """The running kernel's boot id (the same on the host and in its containers, new after a
    reboot); else the host name."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return socket.gethostname()


def process_start(pid: int) -> str | None:
    """An opaque mark of process `pid`'s start, unlike a later one's with its pid (None: no
    such process): on Linux the boot id and the start in clock ticks since boot
    (/proc/<pid>/stat, field 22), which no clock change moves; else psutil's."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():  # Linux: the process is gone
            return None
    except OSError:
        pass
    else:  # the name, field 2, is in parentheses and may hold spaces and ")"
        return f"{machine_id()}/{stat.rsplit(')', 1)[1].split()[19]}"
    try:
        return f"created {psutil.Process(pid).create_time():.2f}"
    except psutil.Error:
        return None


def process_tags() -> dict[str, str]:
    """The tags that name this process as the one that has a run open."""
    return {
        HOST_TAG: socket.gethostname(),
        MACHINE_TAG: machine_id(),
        PID_TAG: str(os.getpid()),
        PID_START_TAG: process_start(os.getpid()) or "",
    }


def why_gone(tags: Mapping[str, str]) -> str | None:
    """Why the process that has a run open is gone (None: alive, or another machine's). One
    in another pid namespace of this kernel (a container) is gone unless the same pid with
    the same start is visible here: DVC's lock never lets two stages of a checkout run at once."""
    host, pid = tags.get(HOST_TAG), tags.get(PID_TAG)
    if tags.get(MACHINE_TAG, host) not in (machine_id(), socket.gethostname()):
        return None
    if pid is None:
        return "no process recorded for it"
    if pid.isdigit() and process_start(int(pid)) == tags.get(PID_START_TAG):
        return None
    return f"its process {pid} on {host} is gone (killed outright: kill -9, the OOM killer)"


def close_zombies(experiment_id: str, parent: str, variant: str, keep: str | None = None) -> None:
    """End as KILLED every RUNNING run of `variant` in `parent` whose process is gone."""
    which = f"tags.`mlflow.parentRunId` = '{parent}' and tags.variant = '{variant}'"
    _close_gone(experiment_id, which, keep)


def close_gone_by_hand(experiment_id: str) -> None:
    """End as KILLED the pipeline runs by hand whose process was killed outright, and their
    variants' runs left RUNNING with them."""
    which = f"tags.`{ROLE_TAG}` = 'pipeline' and tags.`{BY_HAND_TAG}` = 'true'"
    for parent in _close_gone(experiment_id, which):
        _close_gone(experiment_id, f"tags.`mlflow.parentRunId` = '{parent}'")


def _close_gone(experiment_id: str, which: str, keep: str | None = None) -> list[str]:
    """End as KILLED, tagged with why, the RUNNING runs `which` selects whose process is gone."""
    client = MlflowClient()
    running = client.search_runs(
        [experiment_id], filter_string=f"{which} and attributes.status = 'RUNNING'"
    )
    closed = []
    for run in running:
        why = why_gone(run.data.tags) if run.info.run_id != keep else None
        if why is None:
            continue
        client.set_tag(run.info.run_id, CLOSED_TAG, f"closed by a rerun: {why}")
        client.set_terminated(run.info.run_id, status="KILLED")
        name = run.data.tags.get("variant", run.info.run_name)
        log(f"{name}: MLflow run {run.info.run_id} was left RUNNING ({why}); marked KILLED")
        closed.append(run.info.run_id)
    return closed
