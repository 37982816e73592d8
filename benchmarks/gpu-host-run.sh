#!/usr/bin/env bash
# The figures of record: a full `dvc repro` on an air-gapped GPU host, installed from the
# wheelhouse (make wheelhouse PY=3.12), with the MNIST files in $ACCELBENCH_MNIST_MIRROR.
# Writes results.tgz (reports, env facts, metrics, dvc.lock) and the MLflow run summary to
# $OUT (default: ./gpu-run). Run from the repository root: bash benchmarks/gpu-host-run.sh
set -euo pipefail
OUT="${OUT:-$PWD/gpu-run}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MLFLOW_DISABLE_TELEMETRY=true

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD/src" PATH="/tmp/site/bin:$PATH"
# The stages call `accelbench`; without an installed entry point, a shim does.
printf '#!/bin/sh\nexec python3 -m accelbench.cli "$@"\n' > /tmp/site/bin/accelbench
chmod +x /tmp/site/bin/accelbench
[ -d .git ] || { git init -q && git add -A && git -c user.name=run -c user.email=run@localhost commit -qm run; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu \
  --format=csv | tee "$OUT/nvidia-smi.csv"
start=$(date +%s)
dvc repro 2>&1 | tee "$OUT/dvc-repro.log"
echo "dvc repro wall time: $(( $(date +%s) - start )) s" | tee -a "$OUT/dvc-repro.log"
accelbench runs | tee "$OUT/mlflow-runs.md"
tar czf "$OUT/results.tgz" reports env metrics dvc.lock
