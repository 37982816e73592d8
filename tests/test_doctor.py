from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

from accelbench.system import doctor

GOOD = doctor.Facts(
    torch_version="2.14.1+cu130",
    torch_cuda="13.0",
    cudnn=92400,
    arch_list=("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"),
    driver="580.159.04",
    driver_cuda="13.0",
    nvml_gpus=("NVIDIA H200",),
    cuda_available=True,
    torch_gpus=("NVIDIA H200",),
    capability=(9, 0),
    bf16=True,
    kernel_ok=True,
)
CPU_ONLY = doctor.Facts(
    torch_version="2.14.1+cu130",
    torch_cuda="13.0",
    cudnn=92400,
    arch_list=GOOD.arch_list,
    driver=None,
    driver_cuda=None,
)


def _replace(**changes) -> doctor.Facts:
    return doctor.Facts(**{**GOOD.__dict__, **changes})


def test_gpu_ready() -> None:
    report = doctor.diagnose(GOOD, require_gpu=True)
    assert report.exit_code == doctor.EXIT_OK and not report.problems
    assert ("verdict", "GPU ready") in report.rows
    assert "580.159.04" in doctor.render(report)


def test_cpu_only_machine_is_reported_with_its_own_code() -> None:
    report = doctor.diagnose(CPU_ONLY)
    assert report.exit_code == doctor.EXIT_CPU_ONLY
    assert "CPU only: no NVIDIA driver" in doctor.render(report)
    required = doctor.diagnose(CPU_ONLY, require_gpu=True)
    assert required.exit_code == doctor.EXIT_PROBLEM
    assert "--gpus all" in required.problems[0]


def test_driver_older_than_the_runtime() -> None:
    report = doctor.diagnose(_replace(driver="535.104.05", driver_cuda="12.2"))
    assert report.exit_code == doctor.EXIT_PROBLEM
    message = report.problems[0]
    assert (
        "535.104.05" in message and "12.2" in message and "13.0" in message and ">= 580" in message
    )


def test_cpu_only_torch_on_a_gpu_machine() -> None:
    facts = _replace(
        torch_cuda=None,
        torch_version="2.14.1+cpu",
        cuda_available=False,
        torch_gpus=(),
        arch_list=(),
        capability=None,
        kernel_ok=None,
    )
    report = doctor.diagnose(facts)
    assert report.exit_code == doctor.EXIT_PROBLEM
    assert "CPU-only build" in report.problems[0]


def test_gpu_architecture_missing_from_the_build() -> None:
    report = doctor.diagnose(_replace(capability=(3, 7), nvml_gpus=("Tesla K80",)))
    assert report.exit_code == doctor.EXIT_PROBLEM
    assert "3.7" in report.problems[0] and "sm_75" in report.problems[0]


def test_ptx_of_the_same_major_architecture_is_enough() -> None:
    facts = _replace(capability=(8, 9), arch_list=("sm_80", "compute_80"))
    assert doctor.diagnose(facts).exit_code == doctor.EXIT_OK
    assert doctor.diagnose(_replace(capability=(8, 9), arch_list=("sm_80",))).problems


def test_driver_present_but_gpu_not_visible_to_torch() -> None:
    facts = _replace(
        cuda_available=False, torch_gpus=(), capability=None, kernel_ok=None, bf16=None
    )
    report = doctor.diagnose(facts, require_gpu=True)
    assert report.exit_code == doctor.EXIT_PROBLEM
    assert "--gpus all" in report.problems[0]


def test_failing_kernel() -> None:
    report = doctor.diagnose(_replace(kernel_ok=False, kernel_error="no kernel image is available"))
    assert report.problems == ["a small CUDA kernel failed: no kernel image is available"]


def _fake_pynvml(monkeypatch, *, driver: str | None) -> None:
    module = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    module.NVMLError = NVMLError

    def init() -> None:
        if driver is None:
            raise NVMLError("Driver Not Loaded")

    module.nvmlInit = init
    module.nvmlShutdown = lambda: None
    module.nvmlSystemGetDriverVersion = lambda: driver.encode()
    module.nvmlSystemGetCudaDriverVersion_v2 = lambda: 12020
    module.nvmlDeviceGetCount = lambda: 2
    module.nvmlDeviceGetHandleByIndex = lambda i: i
    module.nvmlDeviceGetName = lambda handle: f"NVIDIA A100 #{handle}"
    monkeypatch.setitem(sys.modules, "pynvml", module)


def test_gather_reads_nvml_and_torch_through_fakes(monkeypatch) -> None:
    _fake_pynvml(monkeypatch, driver="535.104.05")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    facts = doctor.gather()
    assert facts.driver == "535.104.05" and facts.driver_cuda == "12.2"
    assert facts.nvml_gpus == ("NVIDIA A100 #0", "NVIDIA A100 #1")
    assert facts.cuda_available is False
    report = doctor.diagnose(facts)
    assert report.exit_code == doctor.EXIT_PROBLEM  # torch is built for a newer CUDA than 12.2


def test_gather_without_a_driver(monkeypatch) -> None:
    _fake_pynvml(monkeypatch, driver=None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    facts = doctor.gather()
    assert facts.driver is None and facts.nvml_gpus == ()
    assert doctor.diagnose(facts).exit_code == doctor.EXIT_CPU_ONLY


def test_torch_without_bytecode_is_named_with_what_to_run() -> None:
    """An H200 host's torch had no .pyc and PYTHONDONTWRITEBYTECODE set: every stage
    compiled it from source (docs/results/2026-12-03-h200-stage-anatomy.md)."""
    facts = _replace(torch_bytecode=False, torch_folder="/opt/venv/site-packages/torch")
    report = doctor.diagnose(facts)
    assert report.exit_code == doctor.EXIT_OK  # slower, not wrong
    assert "python -m compileall -q -j 0 /opt/venv/site-packages/torch" in doctor.render(report)
    assert "torch bytecode" not in doctor.render(doctor.diagnose(GOOD))


def test_gather_finds_this_environment_s_torch_bytecode(monkeypatch) -> None:
    _fake_pynvml(monkeypatch, driver=None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    facts = doctor.gather()
    assert facts.torch_bytecode is True  # make setup and the image compile it
    assert facts.torch_folder == str(Path(torch.__file__).parent)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine's answer")
def test_cli_doctor_on_this_cpu_only_machine(capsys) -> None:
    from accelbench.cli import main

    assert main(["doctor"]) == doctor.EXIT_CPU_ONLY
    assert "CPU only" in capsys.readouterr().out
    assert main(["doctor", "--require-gpu"]) == doctor.EXIT_PROBLEM
