#!/usr/bin/env bash
# Cold compile candidates on a fresh H200: bash explore.sh CANDIDATE... (runN/candidates.txt lists each run's), from the repository root
set -uo pipefail
export ACCELBENCH_MNIST_MIRROR=$PWD/.rec/mnist
t0=$(date +%s)
source benchmarks/gpu-host-setup.sh > $OUT/setup.log 2>&1
echo "setup $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.backends.cudnn.version())"
dvc repro prepare > $OUT/prepare.log 2>&1; echo "prepare rc $?"
python3 benchmarks/step_options.py "$@" --epochs 4 2>&1 | tee $OUT/step-options.jsonl
echo "total $(( $(date +%s) - t0 )) s"
