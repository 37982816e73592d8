#!/usr/bin/env bash
# The README's GPU test command on one H200, with the engine's detached captured loss.
set -uo pipefail
: "${OUT:?}"
W=$PWD; D=$W/.rec3; R=$OUT/s; mkdir -p "$R"
cd /; rm -rf /tmp/site
exec > >(tee "$R/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date
export ACCELBENCH_MNIST_MIRROR=$D/mnist
cd "$W"; ln -sfn .rec3/.whl .whl
source benchmarks/gpu-host-setup.sh > "$R/setup.log" 2>&1
python3 -c "import torch, torch.distributed as d; print(torch.__version__, torch.cuda.nccl.version())"
timeout 480 python3 -m pytest -m gpu -v -p no:cacheprovider > "$R/pytest-gpu.log" 2>&1
echo "pytest rc=$?"; grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed" "$R/pytest-gpu.log" | tail -20
date
cd "$OUT" && tar czf s.tgz s && rm -rf s
