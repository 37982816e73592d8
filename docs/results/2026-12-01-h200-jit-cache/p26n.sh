#!/usr/bin/env bash
# #26: why a portable first epoch with cudnn benchmark on stays slow with the JIT cache
# restored. Does the Inductor cache folder's *path* matter? A: cold gpu training with the
# Inductor/Triton caches at a fixed path /tmp/ic; B: fresh clone, /tmp/ic emptied, same path,
# gpu.bin alone; C: fresh clone, caches at another path /tmp/ic2. The JIT folder is listed
# before and after each run: new entries after a restore mean code the JIT had not seen.
set -uo pipefail
: "${OUT:?}"
W=$PWD; D=$(cd .. && pwd); R=$OUT/r; mkdir -p "$R"
rm -rf /tmp/P /tmp/A /tmp/B /tmp/C /tmp/E /tmp/ic* /tmp/site /tmp/m
exec > >(tee "$R/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date
export ACCELBENCH_MNIST_MIRROR=$D/mnist
ln -sfn ../.whl .whl
source benchmarks/gpu-host-setup.sh > "$R/setup.log" 2>&1
git clone -q "$W" /tmp/P && (cd /tmp/P && dvc repro prepare > "$R/prepare.log" 2>&1)
sed 's/^  epochs: 10/  epochs: 3/' /tmp/P/params.yaml > /tmp/d3.yaml
jit() { find "$1/.accelbench/cuda-jit-cache" -type f 2>/dev/null | wc -l; }
train() {  # dir label [env...]
  local dir=$1 label=$2; shift 2
  cd "$dir"; local before; before=$(jit "$dir")
  env "$@" accelbench --params /tmp/d3.yaml train gpu --data /tmp/P/data/prepared --model /tmp/m/$label.pt \
    --metrics /tmp/m/$label --compile-cache compile-cache/gpu.bin --quiet > "$R/$label.log" 2>&1
  python3 - "$label" "$before" "$(jit "$dir")" <<'PY' 2>&1
import json, sys
l, b, a = sys.argv[1:]; d = json.load(open(f"/tmp/m/{l}/train.json"))
print(f"{l:24s} {d.get('compile_cache')!s:9s} first {d['first_epoch_s']:.2f} s  steady {d['steady_epoch_s']:.4f} s  JIT files {b} -> {a}")
PY
  find "$dir/.accelbench/cuda-jit-cache" -type f -printf '%s %p\n' 2>/dev/null | sort -k2 > "$R/$label.jit"
}
fresh() { git clone -q "$W" "$1" && mkdir -p "$1/compile-cache" && cp /tmp/A/compile-cache/gpu.bin "$1/compile-cache/"; python3 "$D/evict.py" > /dev/null; }
mkdir -p /tmp/m; git clone -q "$W" /tmp/A; mkdir -p /tmp/A/compile-cache
FIX=(TORCHINDUCTOR_CACHE_DIR=/tmp/ic TRITON_CACHE_DIR=/tmp/ic/triton)
train /tmp/A A-cold-fixed "${FIX[@]}"
rm -rf /tmp/ic; fresh /tmp/B; train /tmp/B B-portable-fixed-path "${FIX[@]}"
train /tmp/B B-warm-fixed-path "${FIX[@]}"
fresh /tmp/C; train /tmp/C C-portable-other-path TORCHINDUCTOR_CACHE_DIR=/tmp/ic2 TRITON_CACHE_DIR=/tmp/ic2/triton
rm -rf /tmp/ic; fresh /tmp/E; train /tmp/E E-portable-fixed-again "${FIX[@]}"
train /tmp/C C-warm TORCHINDUCTOR_CACHE_DIR=/tmp/ic2 TRITON_CACHE_DIR=/tmp/ic2/triton
date
cd "$OUT" && tar czf r.tgz r && rm -rf r
