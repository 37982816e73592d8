#!/usr/bin/env bash
# #26, machine 2 (a new lent H200): a fresh clone at the same path as machine 1's (/tmp/W),
# given only machine 1's compile-cache/{gpu,amp}.bin, runs a whole `dvc repro`. Then the GPU
# tests of the JIT cache and of the engine (the AccumulateGrad stream warning).
set -uo pipefail
: "${OUT:?}"
W=$PWD; D=$(cd .. && pwd); R=$OUT/r; mkdir -p "$R"
cd /; rm -rf /tmp/W /tmp/site
exec > >(tee "$R/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader; nproc; date
ls ~/.nv/ComputeCache 2>/dev/null | head -3; echo "driver JIT cache entries: $(find ~/.nv -type f 2>/dev/null | wc -l)"
export ACCELBENCH_MNIST_MIRROR=$D/mnist
cd "$W"; ln -sfn ../.whl .whl
t0=$(date +%s.%N)
source benchmarks/gpu-host-setup.sh > "$R/setup.log" 2>&1
echo "setup $(python3 -c "print(round($(date +%s.%N)-$t0,1))") s"
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.backends.cudnn.version())"
git clone -q "$W" /tmp/W && mkdir -p /tmp/W/compile-cache
for v in gpu amp; do xz -dc "$D/bins/$v.bin.xz" > /tmp/W/compile-cache/$v.bin; done
sha256sum /tmp/W/compile-cache/*.bin
cd /tmp/W
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
cp -r reports dvc.lock "$R/"; mkdir -p "$R/metrics"; cp -r metrics/* "$R/metrics/" 2>/dev/null
find .accelbench/cuda-jit-cache -type f -printf '%s %P\n' | sort -k2 > "$R/jit-after.txt"
cd "$W"
timeout 240 python3 -m pytest -m gpu -v -p no:cacheprovider tests/test_compile_cache.py tests/test_engine.py > "$R/pytest-gpu.log" 2>&1
echo "pytest rc=$?"; tail -15 "$R/pytest-gpu.log"
date
cd "$OUT" && tar czf r.tgz r && rm -rf r
