#!/usr/bin/env bash
# A run of record (benchmarks/gpu-host-e2e.sh), then `pytest -m gpu`, then, with the time
# left, amp's cold first epoch with and without forked compile workers, alternating, on one
# fresh lent GPU: bash final.sh from the repository root (OUT: where logs go; at most 8 files
# come back, so the e2e logs travel as one archive).
set -uo pipefail
export ACCELBENCH_MNIST_MIRROR=$PWD/.rec/mnist
t0=$(date +%s)
OUT=$OUT/e2e bash benchmarks/gpu-host-e2e.sh > $OUT/e2e.log 2>&1; echo "e2e rc $? at $(( $(date +%s) - t0 )) s"
tar czf $OUT/e2e/logs.tgz -C $OUT/e2e env.txt dvc-repro.log mlflow-runs.md after.log \
  && rm -f $OUT/e2e/{env.txt,dvc-repro.log,mlflow-runs.md,after.log}
tar xzf $OUT/e2e/logs.tgz -O dvc-repro.log | tail -3
tar xzf $OUT/e2e/logs.tgz -O after.log | grep -v "^[0-9]" | tail -12
sed -n '1,30p' reports/comparison.md
source benchmarks/gpu-host-setup.sh > /dev/null 2>&1
left=$(( 560 - ($(date +%s) - t0) ))
echo "pytest budget $left s"
[ $left -gt 60 ] && timeout $left python3 -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee $OUT/gpu-tests.txt | tail -5
left=$(( 575 - ($(date +%s) - t0) ))
echo "step options budget $left s"
[ $left -gt 60 ] && timeout $left python3 benchmarks/step_options.py amp:fork amp:base amp:fork amp:base \
  --epochs 3 > $OUT/step-options.jsonl 2>&1
cut -c1-300 $OUT/step-options.jsonl 2>/dev/null | tail -8
echo "total $(( $(date +%s) - t0 )) s"
