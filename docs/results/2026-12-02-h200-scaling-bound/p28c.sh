#!/usr/bin/env bash
# Issue #28 with one H200: the two-GPU runbook's sweep script as shipped, on a host with one
# GPU: ddp2 and ddp2_amp are skipped, and their rows still get the bound from gpu and amp
# at the global and the per-GPU batch (a second host's sample of run b's bound).
set -uo pipefail
R=$OUT/c; mkdir -p "$R"
exec > >(tee "$R/log.txt") 2>&1
ln -sfn .rec3/.whl .whl
export ACCELBENCH_MNIST_MIRROR=$PWD/.rec3/mnist
date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
OUT=$R PROFILE= RUN_TESTS=0 PHASE_LIMIT_S=470 SCALING=strong \
  bash benchmarks/gpu-host-scaling.sh 256+512+1024:gpu,amp,ddp2,ddp2_amp
date; ps -eo pid,etimes,cmd | grep -E "accelbench|torchrun" | grep -v grep || echo "no accelbench or torchrun process left"
cd /; rm -f "$R"/*.tgz; find "$R" -name '*.pt' -delete
tar czf "$OUT/c.tgz" -C "$OUT" c
