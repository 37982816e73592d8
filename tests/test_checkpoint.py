"""checkpoint.py: a state is resumed only under the params it was saved with."""

from __future__ import annotations

from accelbench.checkpoint import Checkpointer


def test_a_state_saved_under_other_params_is_not_resumed(tmp_path) -> None:
    path = tmp_path / "checkpoint.pt"
    saved_under = Checkpointer(path, {"train": {"lr": 0.1}}, "cpu")
    saved_under.saver("run-1")({"epochs_done": 3})
    resumed = Checkpointer(path, {"train": {"lr": 0.1}}, "cpu").load()
    assert resumed is not None and resumed.epochs_done == 3 and resumed.mlflow_run_id == "run-1"
    assert Checkpointer(path, {"train": {"lr": 0.2}}, "cpu").load() is None


def test_without_a_path_nothing_is_saved_or_resumed(tmp_path) -> None:
    checkpointer = Checkpointer(None, {}, "ddp")
    assert checkpointer.saver("run") is None and checkpointer.load() is None
    checkpointer.discard()  # nothing to remove, no error
