"""env: record the machine's stable hardware and software facts (re-runs on every repro).

Under `train.require_gpu` it also refuses, before any work, a machine on which a variant
cannot run: the training stages do not depend on that key, so this is where a change to it
takes effect on `dvc repro`.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from accelbench.core import phases
from accelbench.core.console import StageError, log
from accelbench.core.env_facts import EnvFacts
from accelbench.core.outputs import (
    ENV_FACTS,
    env_json,
    refuse_foreign,
    refuse_foreign_folder,
    remove_leftovers,
    staged,
    write_json,
)
from accelbench.core.params import Params, VariantParams
from accelbench.system import doctor, hardware
from accelbench.training import placement


@dataclass(frozen=True)
class EnvInputs:
    require_gpu: bool
    variants: Mapping[str, VariantParams]


def select(params: Params) -> EnvInputs:
    return EnvInputs(params.train.require_gpu, params.variants)


def run(inputs: EnvInputs, out_dir: Path) -> EnvFacts:
    with phases.phase("imports"):  # the facts come from torch
        import torch  # noqa: F401
    refuse_foreign_folder(out_dir)
    for device, kind in ENV_FACTS.items():  # before any work: a user's file is never replaced
        refuse_foreign(env_json(out_dir, device), kind)
    probe = hardware.probe_gpus()  # once: the facts below and the doctor's share it
    facts = EnvFacts(hardware.cpu_facts(), hardware.cuda_facts(probe))
    files = facts.files()
    remove_leftovers(*(env_json(out_dir, device) for device in files))
    with staged() as outputs:  # both new or both old
        for device, payload in files.items():
            write_json(outputs(env_json(out_dir, device), ENV_FACTS[device]), payload)
    for problem in doctor.diagnose(doctor.gather(probe)).problems:
        log(f"env: WARNING: {problem}")
    cpu, gpu = facts.cpu, facts.cuda.gpu
    log(f"env: CPU {cpu.cpu_model} ({cpu.logical_cpus} logical CPUs)")
    if gpu is not None:
        log(f"env: GPU {', '.join(gpu.gpu_names)}, driver {facts.cuda.nvidia_driver}")
    else:
        log(f"env: no usable GPU: {facts.cuda.reason}")
    here = placement.Visible.of(probe)
    refused = placement.refusals(inputs.variants, here)
    if inputs.require_gpu and refused:
        why = f" No usable GPU here: {here.why_none}." if here.why_none else ""
        raise StageError(
            "train.require_gpu is true, but " + "; ".join(refused) + f".{why} "
            + placement.REFUSAL_ADVICE
        )  # fmt: skip
    return facts


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="folder for cpu.json and cuda.json")


def main(args: argparse.Namespace, params: Params, root: Path) -> None:
    run(select(params), args.out)
