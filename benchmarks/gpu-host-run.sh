#!/usr/bin/env bash
# The figures of record: a full `dvc repro` on an air-gapped GPU host, installed from the
# wheelhouse (make wheelhouse PY=3.12 HOST_PACKAGES=tools/host-packages/nvidia-h200.txt), with
# the MNIST files in $ACCELBENCH_MNIST_MIRROR.
# Writes results.tgz (reports, env facts, metrics, dvc.lock, each stage's timing), store.tgz
# (the MLflow store and its artifacts) and the MLflow run summary to $OUT (default:
# ./gpu-run). Run from the repository root: bash benchmarks/gpu-host-run.sh
set -euo pipefail
OUT="${OUT:-$PWD/gpu-run}"
mkdir -p "$OUT"
source benchmarks/gpu-host-setup.sh

host_facts | tee "$OUT/env.txt"
start=$(date +%s)
dvc repro 2>&1 | tee "$OUT/dvc-repro.log"
echo "dvc repro wall time: $(( $(date +%s) - start )) s" | tee -a "$OUT/dvc-repro.log"
tar czf "$OUT/results.tgz" reports env metrics dvc.lock .accelbench/timings
tar czf "$OUT/store.tgz" mlflow.db mlartifacts
accelbench runs | tee "$OUT/mlflow-runs.md"
