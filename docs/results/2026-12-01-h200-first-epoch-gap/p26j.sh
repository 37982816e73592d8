#!/usr/bin/env bash
# p26i: a fresh clone given a warm clone's whole compile cache is still slow (7.2 s), the same
# clone's second run is fast (3.1 s). Which other per-clone state: the MLflow store
# (mlflow.db, mlartifacts) or .accelbench's other files?
set -uo pipefail
: "${OUT:?}"
W=$PWD
R=$OUT/r; mkdir -p $R
rm -rf /tmp/P /tmp/C /tmp/P1 /tmp/Q*
export ACCELBENCH_MNIST_MIRROR=$W/../mnist
ln -sfn ../.whl .whl
source benchmarks/gpu-host-setup.sh > "$R/setup.log" 2>&1
git clone -q "$W" /tmp/P && cd /tmp/P && dvc repro prepare > "$R/prepare.log" 2>&1
sed 's/^  epochs: 10/  epochs: 2/' params.yaml > /tmp/d.yaml
train() {  # $1 clone dir, $2 label
  cd "$1"
  accelbench --params /tmp/d.yaml train gpu --data /tmp/P/data/prepared \
    --model /tmp/$2.pt --metrics /tmp/$2 --compile-cache compile-cache/gpu.bin --quiet > "$R/$2.log" 2>&1
  python3 -c "import json; d=json.load(open('/tmp/$2/train.json')); print('$2', d.get('compile_cache'), round(d['first_epoch_s'],2))" >> "$R/summary.txt" 2>&1
}
clone() { git clone -q "$W" "$1" && mkdir -p "$1/compile-cache" "$1/.accelbench" && cp /tmp/gpu.bin "$1/compile-cache/gpu.bin"; }
git clone -q "$W" /tmp/C; mkdir -p /tmp/C/compile-cache; train /tmp/C cold
cp /tmp/C/compile-cache/gpu.bin /tmp/gpu.bin
clone /tmp/P1; train /tmp/P1 portable1
(cd /tmp/P1 && find .accelbench -path .accelbench/compile-cache -prune -o -type f -print; ls -la mlartifacts mlflow.db) > $R/P1-state.txt 2>&1
clone /tmp/Q1; cp -a /tmp/P1/mlflow.db /tmp/P1/mlartifacts /tmp/Q1/; train /tmp/Q1 plus-mlflow-store
clone /tmp/Q2; (cd /tmp/P1/.accelbench && tar cf - --exclude=compile-cache .) | (cd /tmp/Q2/.accelbench && tar xf -); train /tmp/Q2 plus-accelbench-state
train /tmp/Q2 Q2-second
cat "$R/summary.txt"
cd $OUT && tar czf r.tgz r && rm -rf r
