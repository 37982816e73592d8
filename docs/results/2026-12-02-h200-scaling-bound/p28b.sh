#!/usr/bin/env bash
# Issue #28 with one H200: the single-GPU steady epoch of gpu and amp across batch sizes, in
# one run. A two-GPU strong-scaling run at global batch B does each GPU's half of the epoch
# at batch B/2, so with communication free its efficiency would be T1(B) / T1(B/2): this
# run bounds, from above, what two GPUs can reach at each global batch.
set -uo pipefail
W=$PWD; R=$OUT/b; mkdir -p "$R"
exec > >(tee "$R/log.txt") 2>&1
ln -sfn .rec3/.whl .whl; source benchmarks/gpu-host-setup.sh
date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
python3 -c "import torch;print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"
export ACCELBENCH_MNIST_MIRROR=$W/.rec3/mnist
dvc repro prepare > "$R/prepare.log" 2>&1 || { tail -20 "$R/prepare.log"; exit 1; }
timeout 480 python3 benchmarks/scaling.py --batch-sizes 256 512 1024 2048 4096 8192 \
  --only gpu amp --scaling strong --out "$R/sweep"
date
cd /; tar czf "$OUT/b.tgz" -C "$OUT" b
