#!/usr/bin/env bash
# Time to a trained model on an air-gapped GPU host (docs/results/2026-12-03-h200-end-to-end.md):
# a fresh `dvc repro` of the defaults, every cache cold; then train@amp again with this
# machine's own compile caches removed, so its graphs can come only from the portable file
# that dvc.lock vouches for; then amp_uncompiled from scratch at two more seeds, each a fresh
# process. Needs the wheelhouse in .whl and MNIST in $ACCELBENCH_MNIST_MIRROR.
# Logs and results to $OUT (default ./gpu-run). Run from the repository root.
set -euo pipefail
OUT="${OUT:-$PWD/gpu-run}"
mkdir -p "$OUT"
start=$(date +%s)
source benchmarks/gpu-host-setup.sh
echo "setup $(( $(date +%s) - start )) s" | tee "$OUT/env.txt"
host_facts | tee -a "$OUT/env.txt"

start=$(date +%s)
dvc repro 2>&1 | tee "$OUT/dvc-repro.log"
echo "dvc repro wall time: $(( $(date +%s) - start )) s" | tee -a "$OUT/dvc-repro.log"
accelbench runs > "$OUT/mlflow-runs.md" 2>&1 || true
tar czf "$OUT/results.tgz" reports metrics dvc.lock .accelbench/timings
# The MLflow store of the same run: the README's screenshot is taken from it (tools/mlflow_ui.py).
tar czf "$OUT/store.tgz" mlflow.db mlartifacts

{ rm -rf .accelbench/compile-cache  # only compile-cache/amp.bin can give amp its graphs now
  start=$(date +%s)
  dvc repro -f -s train@amp
  echo "train@amp from the portable cache: $(( $(date +%s) - start )) s"
  grep -h compile_cache metrics/amp/train.json || true
  for seed in 1 2; do
    sed "s/^  seed: 0 /  seed: $seed /" params.yaml > "/tmp/params-$seed.yaml"
    start=$(date +%s)
    accelbench --params "/tmp/params-$seed.yaml" train amp_uncompiled --data data/prepared \
      --model "/tmp/seed$seed/model.pt" --metrics "/tmp/seed$seed" --quiet
    echo "amp_uncompiled seed $seed: $(( $(date +%s) - start )) s from process start"
    cat "/tmp/seed$seed/epochs.csv"
  done
} 2>&1 | tee "$OUT/after.log"
