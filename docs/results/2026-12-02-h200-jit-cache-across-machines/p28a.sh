#!/usr/bin/env bash
# Does the engine's AccumulateGrad assertion fail on the engine before f63413f? One H200.
set -uo pipefail
W=$PWD; D=$W/.rec3; R=$OUT/a; mkdir -p "$R"
exec > >(tee "$R/log.txt") 2>&1
ln -sfn .rec3/.whl .whl; source benchmarks/gpu-host-setup.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch;print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())"
cp "$D/test_p28a_probe.py" tests/
run() {  # $1 label
  echo "=== $1"
  timeout 400 python3 -m pytest -m gpu -q -p no:cacheprovider -s -rA \
    "tests/test_engine.py::test_graph_captured_step_matches_eager_steps" tests/test_p28a_probe.py 2>&1 \
    | grep -E "PROBE|passed|failed|FAILED|PASSED|AccumulateGrad|Error" | head -40
}
run "engine at HEAD"
cp src/accelbench/training/engine.py /tmp/engine_head.py
cp "$D/engine_before_f63413f.py" src/accelbench/training/engine.py
run "engine before f63413f"
cp /tmp/engine_head.py src/accelbench/training/engine.py
rm tests/test_p28a_probe.py
