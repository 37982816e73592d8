"""A training stage's state after every epoch, to resume after a kill with the same params."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .console import log
from .results import atomic_torch_save


@dataclass(frozen=True)
class Resume:
    """A saved state to continue from, and the MLflow run it belongs to."""

    state: dict[str, Any]  # engine.fit's training state
    mlflow_run_id: str | None

    @property
    def epochs_done(self) -> int:
        return self.state["epochs_done"]


class Checkpointer:
    """Saves to and resumes from `path` (None: neither), for one variant and its params.

    The file holds a fingerprint of the run's params: a state saved under other params is
    ignored (training starts over), never resumed.
    """

    def __init__(self, path: Path | None, run_params: dict[str, Any], name: str) -> None:
        self.path, self.name = path, name
        self.fingerprint = hashlib.sha256(
            json.dumps(run_params, sort_keys=True).encode()
        ).hexdigest()

    def load(self) -> Resume | None:
        """The saved state if it belongs to these exact params, else None."""
        if self.path is None or not self.path.is_file():
            return None
        saved = torch.load(self.path, map_location="cpu", weights_only=False)
        if saved.get("fingerprint") != self.fingerprint:
            log(f"train {self.name}: {self.path} is from other params; starting from epoch 1")
            return None
        resume = Resume(saved["state"], saved["mlflow_run_id"])
        log(f"train {self.name}: resuming after epoch {resume.epochs_done} from {self.path}")
        return resume

    def saver(self, mlflow_run_id: str | None):
        """engine.fit's `on_checkpoint` (None when there is nowhere to save)."""
        if self.path is None:
            return None

        def save(state: dict[str, Any]) -> None:
            payload = {"fingerprint": self.fingerprint, "mlflow_run_id": mlflow_run_id}
            atomic_torch_save(payload | {"state": state}, self.path)

        return save

    def discard(self) -> None:
        """Training finished: the outputs are the record now."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)
