#!/usr/bin/env bash
# Is the gap the CUDA driver's JIT cache, keyed by something path-dependent? A gpu.bin from
# another machine (p26g); CUDA_CACHE_PATH=/tmp/jit, empty at first. X1: new path, empty JIT
# cache. X1 again: same path re-cloned, JIT cache from X1's run. X2: new path, same JIT cache.
set -uo pipefail
: "${OUT:?}"
W=$PWD
R=$OUT; 
export ACCELBENCH_MNIST_MIRROR=$W/../mnist CUDA_CACHE_PATH=/tmp/jit
ln -sfn ../.whl .whl
source benchmarks/gpu-host-setup.sh > "$R/setup.log" 2>&1
gunzip -c "$W/../gpu-g3.bin.gz" > /tmp/gpu-g3.bin
git clone -q "$W" /tmp/P && cd /tmp/P && accelbench prepare > "$R/prepare.log" 2>&1
sed 's/^  epochs: 10/  epochs: 2/' params.yaml > /tmp/d.yaml
train() {  # $1 clone dir, $2 label
  rm -rf "$1"; git clone -q "$W" "$1" && mkdir -p "$1/compile-cache" && cp /tmp/gpu-g3.bin "$1/compile-cache/gpu.bin"
  cd "$1"
  accelbench --params /tmp/d.yaml train gpu --data /tmp/P/data/prepared \
    --model /tmp/$2.pt --metrics /tmp/$2 --compile-cache compile-cache/gpu.bin --quiet > "$R/$2.log" 2>&1
  python3 -c "import json; d=json.load(open('/tmp/$2/train.json')); print('$2', d.get('compile_cache'), round(d['first_epoch_s'],2))" >> "$R/summary.txt" 2>&1
  du -s /tmp/jit >> "$R/summary.txt" 2>&1
}
train /tmp/X1 X1-new-path-empty-jit
train /tmp/X1 X1-same-path-reclone
train /tmp/X2 X2-new-path
cat "$R/summary.txt"
