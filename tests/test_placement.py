"""placement.py: one rule for where a variant runs, with GPUs faked (what a CPU-only machine
cannot show: too few GPUs, torchrun's children)."""

from __future__ import annotations

import pytest
import torch

from accelbench.core.console import StageError
from accelbench.core.params import VariantParams
from accelbench.training import placement

CPU = VariantParams(device="cpu")
GPU = VariantParams(device="cuda")
DDP2 = VariantParams(device="cuda", distributed={"nproc_per_node": 2})
NONE = placement.Visible(0, "no NVIDIA driver found")
ONE = placement.Visible(1)


def test_a_cpu_variant_runs_on_the_cpu_anywhere() -> None:
    where = placement.place("cpu", CPU, require_gpu=True, environ={}, here=NONE)
    assert where.device == torch.device("cpu") and where.main and where.world_size == 1


def test_a_missing_gpu_skips_or_refuses_with_one_message() -> None:
    skipped = placement.place("gpu", GPU, require_gpu=False, environ={}, here=NONE)
    assert skipped.skip_reason == "needs CUDA but no NVIDIA driver found"
    with pytest.raises(StageError) as refused:
        placement.place("gpu", GPU, require_gpu=True, environ={}, here=NONE)
    assert str(refused.value) == f"variant 'gpu' {skipped.skip_reason}. {placement.REFUSAL_ADVICE}"


def test_a_ddp_variant_needs_its_gpus_then_launches_torchrun() -> None:
    short = placement.place("ddp", DDP2, require_gpu=False, environ={}, here=ONE)
    assert short.skip_reason == (
        "asks for 2 GPUs per node (distributed.nproc_per_node) but this machine has 1"
    )
    launch = placement.place("ddp", DDP2, require_gpu=True, environ={}, here=placement.Visible(2))
    assert launch.launch and launch.world_size == 2 and launch.device is None


def test_a_torchrun_child_takes_its_rank_and_world_from_torchrun() -> None:
    gloo = VariantParams(device="cpu", distributed={"nproc_per_node": 2, "nnodes": 2})
    environ = {"LOCAL_RANK": "1", "RANK": "3", "WORLD_SIZE": "4"}
    child = placement.place("ddp", gloo, require_gpu=True, environ=environ, here=NONE)
    assert (child.rank, child.world_size, child.backend) == (3, 4, "gloo")
    assert child.device == torch.device("cpu") and not child.main and not child.launch


def test_env_lists_every_variant_this_machine_cannot_run() -> None:
    variants = {"cpu": CPU, "gpu": GPU, "ddp": DDP2}
    assert placement.refusals(variants, ONE) == [
        "variant 'ddp' asks for 2 GPUs per node (distributed.nproc_per_node) but this machine has 1"
    ]


def test_variants_lacking_the_same_thing_share_one_phrase() -> None:
    """The machine's reason once, not once per variant (it once filled the error line)."""
    variants = {"cpu": CPU, "gpu": GPU, "amp": GPU, "ddp": DDP2, "ddp_b": DDP2}
    assert placement.refusals(variants, NONE) == [
        "variants 'gpu', 'amp' need CUDA",
        "variants 'ddp', 'ddp_b' ask for 2 GPUs per node (distributed.nproc_per_node) but this "
        "machine has 0",
    ]


def test_a_model_trained_on_cuda_is_evaluated_on_cuda_or_refused() -> None:
    assert placement.evaluation_device("ddp", DDP2, ONE) == torch.device("cuda")  # one process
    assert placement.evaluation_device("cpu", CPU, NONE) == torch.device("cpu")
    with pytest.raises(StageError, match=r"evaluate: variant 'gpu' needs CUDA but no NVIDIA"):
        placement.evaluation_device("gpu", GPU, NONE)


def test_nvml_alone_settles_that_too_few_gpus_are_here(monkeypatch) -> None:
    """Fewer GPUs in the driver than a variant needs: the answer, with no torch call."""
    monkeypatch.setattr(placement.hardware, "nvml_gpu_count", lambda: (1, ""))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("asked torch"))
    assert placement.visible(at_least=2) == placement.Visible(1)
    monkeypatch.setattr(placement.hardware, "nvml_gpu_count", lambda: (0, "the driver sees none"))
    assert placement.visible() == placement.Visible(0, "the driver sees none")


def test_a_skipped_variant_s_stages_never_import_torch(tmp_path, prepared) -> None:
    """train, evaluate and quantize of a variant no machine has the GPUs for return at once:
    importing torch (3-6 s on some hosts) is the cost they avoid."""
    import subprocess
    import sys

    from helpers import write_params

    huge = {"device": "cuda", "precision": "fp32", "distributed": {"nproc_per_node": 64}}
    params = write_params(tmp_path, {"cpu": {"device": "cpu"}, "huge": huge})
    files = ["--data", str(prepared), "--model", str(tmp_path / "huge.pt"), "--metrics", "m"]
    stages = [["train", "huge", *files], ["evaluate", *files], ["quantize", *files]]
    script = (
        "import sys\nfrom accelbench import cli\n"
        f"for argv in {stages!r}:\n"
        f"    assert cli.main(['--params', {str(params)!r}, *argv]) == 0, argv\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "train huge: skipped: asks for 64 GPUs per node" in done.stderr
    assert "evaluate huge: skipped" in done.stderr and "quantize huge: skipped" in done.stderr
