"""checkpoint.py: a state is resumed only under the params it was saved with; a file that is
not a usable checkpoint is moved aside with one warning, never run, never a crash."""

from __future__ import annotations

import pickle

import pytest
import torch

from accelbench.core.results import EpochRecord
from accelbench.training import checkpoint
from accelbench.training.checkpoint import Checkpointer
from accelbench.training.engine import TrainingState

CPU = "AMD EPYC"  # a device's name, as placement gives it


def _state(epochs_done: int = 3) -> TrainingState:
    """engine.fit's training state, in miniature."""
    return TrainingState(
        epochs_done=epochs_done,
        model={"conv.weight": torch.zeros(2, 2)},
        optimizer={"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]},
        scheduler=None,
        scaler={},
        rng_cpu=torch.get_rng_state(),
        rng_cuda=None,
        records=[
            EpochRecord(e + 1, 0.5, 1.0, 0.0, 64, 64.0, 0.4, 0.9, 0, 1e-3, None)
            for e in range(epochs_done)
        ],
    )


def test_a_state_saved_under_other_params_is_not_resumed(tmp_path) -> None:
    path = tmp_path / "checkpoint.pt"
    saved_under = Checkpointer(path, {"train": {"lr": 0.1}}, "cpu", device=CPU)
    saved_under.saver("run-1")(_state())
    resumed = Checkpointer(path, {"train": {"lr": 0.1}}, "cpu", device=CPU).load()
    assert resumed is not None and resumed.epochs_done == 3 and resumed.mlflow_run_id == "run-1"
    assert resumed.state.records == _state().records
    assert Checkpointer(path, {"train": {"lr": 0.2}}, "cpu", device=CPU).load() is None


def test_a_state_saved_under_another_torch_or_device_is_not_resumed(
    tmp_path, monkeypatch, capsys
) -> None:
    # Its epochs were timed there: resumed here, one training's figures would mix two stacks.
    path = tmp_path / "checkpoint.pt"
    Checkpointer(path, {}, "gpu", device="NVIDIA H200").saver("run-1")(_state())
    assert Checkpointer(path, {}, "gpu", device="NVIDIA H100 80GB HBM3").load() is None
    assert "from other params, torch or device; starting from epoch 1" in capsys.readouterr().err
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    assert Checkpointer(path, {}, "gpu", device="NVIDIA H200").load() is None
    monkeypatch.undo()
    assert Checkpointer(path, {}, "gpu", device="NVIDIA H200").load() is not None
    assert path.is_file()  # a foreign state is left as it was, not set aside


def test_a_state_saved_under_other_model_code_is_not_resumed(tmp_path, monkeypatch) -> None:
    path = tmp_path / "checkpoint.pt"
    Checkpointer(path, {}, "cpu", device=CPU).saver("run-1")(_state())
    monkeypatch.setattr(checkpoint, "step_code_digest", lambda: "an edited models.py")
    assert Checkpointer(path, {}, "cpu", device=CPU).load() is None
    assert path.is_file()


def test_weights_that_do_not_fit_the_model_are_set_aside(tmp_path, capsys) -> None:
    """A file with the right fingerprint whose weights the model cannot load (crafted, or
    written by a bug) would crash every rerun in load_state_dict: it is set aside."""
    path = tmp_path / "cpu.pt"
    Checkpointer(path, {}, "cpu", device=CPU).saver("run-1")(_state())
    fits = torch.nn.Module()
    fits.conv = torch.nn.Linear(2, 2, bias=False)  # "conv.weight": 2 x 2
    assert Checkpointer(path, {}, "cpu", device=CPU).load(fits) is not None
    for other in (torch.nn.Linear(2, 3, bias=False), torch.nn.Linear(2, 2)):
        model = torch.nn.Module()
        model.conv = other
        Checkpointer(path, {}, "cpu", device=CPU).saver("run-1")(_state())
        assert Checkpointer(path, {}, "cpu", device=CPU).load(model) is None
        assert "do not fit the model's names and shapes" in capsys.readouterr().err
        assert not path.exists() and path.with_name("cpu.pt.bad").exists()
        path.with_name("cpu.pt.bad").unlink()


def test_without_a_path_nothing_is_saved_or_resumed(tmp_path) -> None:
    checkpointer = Checkpointer(None, {}, "ddp", device=CPU)
    assert checkpointer.saver("run") is None and checkpointer.load() is None
    checkpointer.discard()  # nothing to remove, no error


class _RunsCode:
    """A pickle that would create a file when unpickled with weights_only=False."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _bad_files(tmp_path) -> dict[str, bytes]:
    good = tmp_path / "good.pt"
    Checkpointer(good, {}, "cpu", device=CPU).saver("run-1")(_state())
    whole = good.read_bytes()
    marker = tmp_path / "code-ran"
    return {
        "garbage": b"\x00not a checkpoint at all\xff" * 10,
        "empty": b"",
        "truncated": whole[: len(whole) // 2],
        "a list": _torch_bytes(tmp_path, [1, 2, 3]),
        "another dict": _torch_bytes(tmp_path, {"fingerprint": "x", "state": {"epochs_done": 1}}),
        "a renamed epoch field": _torch_bytes(tmp_path, _renamed_field()),
        "pickled code": pickle.dumps(_RunsCode(str(marker))),
    }


def _renamed_field() -> dict:
    state = _state(1).to_dict()
    state["records"][0]["test_acc"] = state["records"][0].pop("test_accuracy")
    return {"fingerprint": "x", "mlflow_run_id": None, "state": state}


def _torch_bytes(tmp_path, payload) -> bytes:
    path = tmp_path / "payload.pt"
    torch.save(payload, path)
    return path.read_bytes()


@pytest.mark.parametrize(
    "kind",
    [
        "garbage",
        "empty",
        "truncated",
        "a list",
        "another dict",
        "a renamed epoch field",
        "pickled code",
    ],
)
def test_a_bad_checkpoint_is_moved_aside_with_one_warning(tmp_path, capsys, kind) -> None:
    path = tmp_path / "checkpoints" / "cpu.pt"
    path.parent.mkdir()
    path.write_bytes(_bad_files(tmp_path)[kind])
    leftover = path.with_name(".cpu.pt.tmp")  # a crash mid-save (a full disk) left this
    leftover.write_bytes(b"partial")
    assert Checkpointer(path, {}, "cpu", device=CPU).load() is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a usable checkpoint" in err[0], err
    assert "moved it to" in err[0] and "starting from epoch 1" in err[0]
    assert not path.exists() and path.with_name("cpu.pt.bad").exists()
    assert not leftover.exists()
    assert not (tmp_path / "code-ran").exists()  # weights_only: the file's code never ran
    # The next start finds nothing to resume, and says nothing.
    assert Checkpointer(path, {}, "cpu", device=CPU).load() is None
    assert capsys.readouterr().err == ""


def test_a_second_bad_checkpoint_never_replaces_the_first_set_aside(tmp_path, capsys) -> None:
    path = tmp_path / "cpu.pt"
    for text in (b"first garbage", b"second garbage", b"third garbage"):
        path.write_bytes(text)
        assert Checkpointer(path, {}, "cpu", device=CPU).load() is None
    aside = {p.name: p.read_bytes() for p in tmp_path.glob("cpu.pt.bad*")}
    assert aside == {
        "cpu.pt.bad": b"first garbage",
        "cpu.pt.bad.1": b"second garbage",
        "cpu.pt.bad.2": b"third garbage",
    }
    assert "moved it to " + str(tmp_path / "cpu.pt.bad.2") in capsys.readouterr().err
