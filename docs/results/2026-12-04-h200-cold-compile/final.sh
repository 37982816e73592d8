#!/usr/bin/env bash
# The run of record (benchmarks/gpu-host-e2e.sh), then where gpu_dataloader's stage spends the
# seconds after its last line, then `pytest -m gpu`, all on one fresh H200.
set -uo pipefail
export ACCELBENCH_MNIST_MIRROR=$PWD/.rec/mnist
t0=$(date +%s)
OUT=$OUT/e2e bash benchmarks/gpu-host-e2e.sh > $OUT/e2e.log 2>&1; echo "e2e rc $? at $(( $(date +%s) - t0 )) s"
tail -5 $OUT/e2e/dvc-repro.log
cat $OUT/e2e/after.log | grep -v "^[0-9]" | tail -12
source benchmarks/gpu-host-setup.sh > /dev/null 2>&1
mkdir -p /tmp/gdl
s=$(date +%s.%N)
python3 .rec/exitwatch.py train gpu_dataloader --data data/prepared --model /tmp/gdl/model.pt --metrics /tmp/gdl --quiet > $OUT/exitwatch.log 2>&1
e=$(date +%s.%N)
echo "gpu_dataloader stage: start $s end $e" | tee -a $OUT/exitwatch.log
python3 -c "import json;d=json.load(open('.accelbench/timings/train@gpu_dataloader.json'));print('timing file wall', d['wall_s'], 'started', d['started'], d['phases'].get('ending'))" | tee -a $OUT/exitwatch.log
grep exitwatch $OUT/exitwatch.log; grep -c "Thread 0x\|File " $OUT/exitwatch.log
left=$(( 585 - ($(date +%s) - t0) ))
echo "pytest budget $left s"
[ $left -gt 60 ] && timeout $left python3 -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee $OUT/gpu-tests.txt | tail -5
echo "total $(( $(date +%s) - t0 )) s"
