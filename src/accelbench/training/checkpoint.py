"""A training stage's state after every epoch, to resume after a kill with the same params.

The file holds only tensors and plain types and is loaded with `weights_only=True`: it
never runs code. A file that is unreadable or not a checkpoint of ours (weights of another
shape included) is moved aside to `<name>.bad` with one warning and training starts over:
never a crash, never a stage stuck on the same file.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from accelbench.core.console import first_sentence, log
from accelbench.core.results import RECORD, Str, atomic_torch_save, check, load_torch, record
from accelbench.training.compile_cache import step_code_digest
from accelbench.training.engine import TrainingState


@dataclass(frozen=True)
class Resume:
    """A saved state to continue from, and the MLflow run it belongs to."""

    state: TrainingState
    mlflow_run_id: str | None

    @property
    def epochs_done(self) -> int:
        return self.state.epochs_done


class Checkpointer:
    """Saves to and resumes from `path` (None: neither), for one variant and its params.

    The file holds a fingerprint of the run's params, torch's version, the `device`'s name and
    the model's and step's code: a state saved under others is never resumed (one training's
    figures would mix two stacks, and an edited model's weights would not load).
    """

    def __init__(
        self, path: Path | None, run_params: dict[str, Any], name: str, *, device: str
    ) -> None:
        self.path, self.name = path, name
        stack = {"torch": torch.__version__, "device": device, "code": step_code_digest()}
        self.fingerprint = hashlib.sha256(
            json.dumps({"params": run_params, "stack": stack}, sort_keys=True).encode()
        ).hexdigest()

    def load(self, model: torch.nn.Module | None = None) -> Resume | None:
        """The saved state if it belongs to these exact params (and its weights fit `model`'s
        names and shapes), else None."""
        if self.path is None:
            return None
        self.path.with_name(f".{self.path.name}.tmp").unlink(missing_ok=True)  # a crash's
        if not self.path.is_file():
            return None
        try:
            saved = load_torch(self.path)
        except Exception as exc:  # unpickling raises many types; none of them is ours
            return self._set_aside(f"unreadable ({first_sentence(exc, 120)})")
        try:
            saved = check(CheckpointFile, saved)
        except ValueError as exc:
            return self._set_aside(str(exc))
        if saved.fingerprint != self.fingerprint:
            log(
                f"train {self.name}: {self.path} is from other params, torch or device; "
                "starting from epoch 1"
            )
            return None
        if model is not None and _shapes(saved.state.model) != _shapes(model.state_dict()):
            return self._set_aside("its weights do not fit the model's names and shapes")
        resume = Resume(saved.state, saved.mlflow_run_id)
        log(f"train {self.name}: resuming after epoch {resume.epochs_done} from {self.path}")
        return resume

    def _set_aside(self, problem: str) -> None:
        # <name>.bad, or .bad.1, .bad.2, ...: an earlier file set aside (the user's,
        # perhaps) is never replaced
        bad = aside = self.path.with_name(self.path.name + ".bad")
        number = 0
        while aside.exists() or aside.is_symlink():
            number += 1
            aside = bad.with_name(f"{bad.name}.{number}")
        os.replace(self.path, aside)
        log(
            f"train {self.name}: warning: {self.path} is not a usable checkpoint ({problem}); "
            f"moved it to {aside} and starting from epoch 1"
        )

    def saver(self, mlflow_run_id: str | None) -> Callable[[TrainingState], None] | None:
        """engine.fit's `on_checkpoint` (None when there is nowhere to save)."""
        if self.path is None:
            return None

        def save(state: TrainingState) -> None:
            payload = {"fingerprint": self.fingerprint, "mlflow_run_id": mlflow_run_id}
            atomic_torch_save(payload | {"state": state.to_dict()}, self.path)

        return save

    def discard(self) -> None:
        """Training finished: the outputs are the record now."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def _shapes(weights: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(tensor.shape) for name, tensor in weights.items()}


@record(frozen=True, config=RECORD)
class CheckpointFile:
    """A checkpoint file: the fingerprint of what it was saved under, and the state."""

    fingerprint: Str
    mlflow_run_id: Str | None
    state: TrainingState
