#!/usr/bin/env bash
# Cold compile candidates, then the uncompiled amp stage timed and profiled, on a fresh H200:
# bash explore.sh CANDIDATE... from the repository root (OUT: where logs go)
set -uo pipefail
export ACCELBENCH_MNIST_MIRROR=$PWD/.rec/mnist
t0=$(date +%s)
source benchmarks/gpu-host-setup.sh > $OUT/setup.log 2>&1
echo "setup $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.backends.cudnn.version())"
dvc repro prepare >> $OUT/setup.log 2>&1; echo "prepare rc $?"
python3 benchmarks/step_options.py "$@" --epochs 4 2>&1 | tee $OUT/step-options.jsonl
echo "candidates done $(( $(date +%s) - t0 )) s"
# the uncompiled amp stage twice as dvc runs it (timings of each), then once under cProfile
dvc repro train@amp_uncompiled > $OUT/stage-1.log 2>&1; echo "stage 1 rc $?"
cp .accelbench/timings/train@amp_uncompiled.json $OUT/stage-1.json
dvc repro --force --single-item train@amp_uncompiled > $OUT/stage-2.log 2>&1; echo "stage 2 rc $?"
cp .accelbench/timings/train@amp_uncompiled.json $OUT/stage-2.json
python3 -m cProfile -o /tmp/stage.prof -m accelbench.cli train amp_uncompiled --data data/prepared \
  --model /tmp/prof/amp_uncompiled.pt --metrics /tmp/prof/metrics --quiet > $OUT/stage-3.log 2>&1
python3 -c "import pstats; pstats.Stats('/tmp/stage.prof').sort_stats('cumulative').print_stats(90)" > $OUT/stage-3-profile.txt
echo "total $(( $(date +%s) - t0 )) s"
