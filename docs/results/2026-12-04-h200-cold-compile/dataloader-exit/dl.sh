#!/usr/bin/env bash
# gpu_dataloader's train stage alone, its workers ended by LoaderBatches.close(): where do
# the seconds after its last line go now?
set -uo pipefail
export ACCELBENCH_MNIST_MIRROR=$PWD/.rec/mnist
source benchmarks/gpu-host-setup.sh > /dev/null 2>&1
dvc repro prepare > /dev/null 2>&1; echo "prepare rc $?"
s=$(date +%s.%N)
python3 .rec/exitwatch.py train gpu_dataloader --data data/prepared --model /tmp/gdl/model.pt --metrics /tmp/gdl --quiet > $OUT/exitwatch-after.log 2>&1
e=$(date +%s.%N)
echo "gpu_dataloader stage: start $s end $e" | tee -a $OUT/exitwatch-after.log
python3 -c "import json;d=json.load(open('.accelbench/timings/train@gpu_dataloader.json'));print('timing file', json.dumps(d))" | tee -a $OUT/exitwatch-after.log
