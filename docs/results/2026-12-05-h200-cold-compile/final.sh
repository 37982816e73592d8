#!/usr/bin/env bash
# The run of record (benchmarks/gpu-host-e2e.sh), then `pytest -m gpu`, on one fresh H200:
# bash final.sh from the repository root (OUT: where logs go; at most 8 files come back).
set -uo pipefail
export ACCELBENCH_MNIST_MIRROR=$PWD/.rec/mnist
t0=$(date +%s)
OUT=$OUT/e2e bash benchmarks/gpu-host-e2e.sh > $OUT/e2e.log 2>&1; echo "e2e rc $? at $(( $(date +%s) - t0 )) s"
tail -5 $OUT/e2e/dvc-repro.log
grep -v "^[0-9]" $OUT/e2e/after.log | tail -12
sed -n '1,40p' reports/comparison.md
source benchmarks/gpu-host-setup.sh > /dev/null 2>&1
left=$(( 585 - ($(date +%s) - t0) ))
echo "pytest budget $left s"
[ $left -gt 60 ] && timeout $left python3 -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee $OUT/gpu-tests.txt | tail -5
echo "total $(( $(date +%s) - t0 )) s"
