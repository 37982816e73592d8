"""stages/env.py: the machine's facts, and train.require_gpu's refusal before any work."""

from __future__ import annotations

import json

import pytest
import torch

from accelbench.core.console import StageError
from accelbench.core.env_facts import read_env
from accelbench.stages import env
from helpers import small_params


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_env_records_facts_and_refuses_cuda_variants_under_require_gpu(tmp_path) -> None:
    facts = env.run(env.select(small_params()), tmp_path / "env")
    assert not facts.cuda.cuda_available and facts.cuda.reason
    assert json.loads((tmp_path / "env" / "cpu.json").read_text())["cpu_model"]
    assert read_env(tmp_path / "env") == facts  # what compare reads back
    with pytest.raises(StageError, match=r"train.require_gpu is true, but") as info:
        env.run(env.select(small_params(require_gpu=True)), tmp_path / "env")
    message = str(info.value)
    assert facts.cuda.reason in message and message.count(facts.cuda.reason) == 1
    assert "'gpu', 'amp'" in message and "need CUDA" in message
    assert "train.require_gpu: false" in message
    cpu_only = small_params({"cpu": {"device": "cpu"}}, require_gpu=True)
    env.run(env.select(cpu_only), tmp_path / "env")  # nothing to refuse
