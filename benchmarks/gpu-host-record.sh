#!/usr/bin/env bash
# A run of record on one fresh lent GPU, in one `run` call of at most 600 s: the GPU's name
# first (a run of record must come from the GPU it names: REQUIRE_GPU, default H200; an
# empty value takes any), then benchmarks/gpu-host-e2e.sh (a cold `dvc repro` of the defaults,
# amp from its portable cache, amp_uncompiled at two more seeds), then the uncompiled train
# stage twice more as `dvc repro` runs it (its stage time is a criterion of issue 39), then
# `pytest -m gpu`. Run from the repository root; logs to $OUT (at most 8 files come back
# from a lent machine, so the e2e logs travel as one archive).
set -uo pipefail
REQUIRE_GPU="${REQUIRE_GPU-H200}"
export ACCELBENCH_MNIST_MIRROR=$PWD/.rec/mnist
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $gpu"
if [[ -n $REQUIRE_GPU && $gpu != *"$REQUIRE_GPU"* ]]; then
  echo "not a $REQUIRE_GPU: nothing run (REQUIRE_GPU= runs on any GPU)"
  exit 3
fi
t0=$(date +%s)
OUT=$OUT/e2e bash benchmarks/gpu-host-e2e.sh > "$OUT/e2e.log" 2>&1
echo "e2e rc $? at $(( $(date +%s) - t0 )) s"
source benchmarks/gpu-host-setup.sh > /dev/null 2>&1  # dvc: e2e's shell had it, not this one
for i in 1 2; do
  dvc repro -f -s train@amp_uncompiled > "$OUT/e2e/again.log" 2>&1 || { tail -3 "$OUT/e2e/again.log"; continue; }
  python3 -c "import json; d = json.load(open('.accelbench/timings/train@amp_uncompiled.json')); \
r = d.get('repeats_s') or 0; print('train@amp_uncompiled again: %.2f s, to its model %.2f s' \
% (d['wall_s'], d['wall_s'] - r), {k: round(v, 2) for k, v in d['phases'].items()})"
done 2>&1 | tee "$OUT/e2e/stage-again.log"
tar czf "$OUT/e2e/logs.tgz" -C "$OUT/e2e" env.txt dvc-repro.log mlflow-runs.md after.log \
  stage-again.log && rm -f "$OUT"/e2e/{env.txt,dvc-repro.log,mlflow-runs.md,after.log,stage-again.log,again.log}
tar xzf "$OUT/e2e/logs.tgz" -O dvc-repro.log | tail -3
tar xzf "$OUT/e2e/logs.tgz" -O after.log | grep -v "^[0-9]" | tail -12
sed -n '1,30p' reports/comparison.md
left=$(( 575 - ($(date +%s) - t0) ))
echo "pytest budget $left s"
[ $left -gt 60 ] && timeout $left python3 -m pytest -m gpu -q -p no:cacheprovider 2>&1 \
  | tee "$OUT/gpu-tests.txt" | tail -5
echo "total $(( $(date +%s) - t0 )) s"
