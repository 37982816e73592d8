#!/usr/bin/env bash
# pytest -m gpu on the lent H200 with this tree; results to $OUT.
set -u
ln -sfn .rec3/.whl .whl
start=$(date +%s)
source benchmarks/gpu-host-setup.sh
export ACCELBENCH_MNIST_MIRROR=$PWD/.rec3/mnist
echo "setup $(( $(date +%s) - start )) s"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), torch.cuda.nccl.version())"
} 2>&1 | tee "$OUT/env.txt"
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tail -40 | tee "$OUT/gpu-tests.txt"
echo "rc=${PIPESTATUS[0]} total $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu-tests.txt"
