#!/usr/bin/env bash
# #26, machine 1: a whole cold `dvc repro` in a fresh clone at /tmp/W; its compile-cache/*.bin
# go back for machine 2, which re-clones at the same path. Also: does the single-GPU
# AccumulateGrad stream warning still print (engine: captured loss detached)?
set -uo pipefail
: "${OUT:?}"
W=$PWD; D=$(cd .. && pwd); R=$OUT/q; mkdir -p "$R"
cd /; rm -rf /tmp/W /tmp/site
exec > >(tee "$R/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; date
export ACCELBENCH_MNIST_MIRROR=$D/mnist
cd "$W"; ln -sfn ../.whl .whl
t0=$(date +%s.%N)
source benchmarks/gpu-host-setup.sh > "$R/setup.log" 2>&1
echo "setup $(python3 -c "print(round($(date +%s.%N)-$t0,1))") s"
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.backends.cudnn.version())"
git clone -q "$W" /tmp/W && cd /tmp/W
s=$(date +%s.%N); dvc repro > "$R/repro.log" 2>&1; rc=$?
echo "dvc repro rc=$rc wall $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"
echo "warnings:"; grep -h "AccumulateGrad\|Grad strides" "$R/repro.log" | sort | uniq -c
grep -h "JIT\|compile cache" "$R/repro.log"
for v in metrics/*/train.json; do python3 - "$v" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"{sys.argv[1]:34s} first {d.get('first_epoch_s')} ({d.get('compile_cache')}) steady {d.get('steady_epoch_s')}")
PY
done
ls -la compile-cache
cp -r reports compile-cache dvc.lock "$R/"; mkdir -p "$R/metrics"; cp -r metrics/* "$R/metrics/" 2>/dev/null
date
cd "$OUT" && tar czf q.tgz q && rm -rf q
