#!/usr/bin/env bash
# #26, the figures for the results page: A trains gpu and amp cold at /tmp/A; A is deleted
# and cloned again at the same path with only the two .bin files (page cache evicted):
# portable gpu and amp with the JIT cache restored. C2: a new path whose CUDA_CACHE_PATH is
# A's folder (is the driver's key the working directory or the cache folder?). C3: amp with
# cudnn_benchmark false at a new path.
set -uo pipefail
: "${OUT:?}"
W=$PWD; D=$(cd .. && pwd); R=$OUT/r; mkdir -p "$R"
rm -rf /tmp/P /tmp/A /tmp/C2 /tmp/C3 /tmp/site /tmp/m /tmp/bins
exec > >(tee "$R/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date
export ACCELBENCH_MNIST_MIRROR=$D/mnist
ln -sfn ../.whl .whl
source benchmarks/gpu-host-setup.sh > "$R/setup.log" 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.backends.cudnn.version())"
git clone -q "$W" /tmp/P && (cd /tmp/P && dvc repro prepare > "$R/prepare.log" 2>&1)
sed 's/^  epochs: 10/  epochs: 3/' /tmp/P/params.yaml > /tmp/d3.yaml
sed 's/cudnn_benchmark: true/cudnn_benchmark: false/' /tmp/d3.yaml > /tmp/d3nb.yaml
jit() { find "${1}" -type f 2>/dev/null | wc -l; }
train() {  # dir label variant params jitdir [env...]
  local dir=$1 label=$2 v=$3 p=$4 jd=$5; shift 5
  cd "$dir"; local before; before=$(jit "$jd")
  env "$@" accelbench --params "$p" train "$v" --data /tmp/P/data/prepared --model /tmp/m/$label.pt \
    --metrics /tmp/m/$label --compile-cache compile-cache/$v.bin --quiet > "$R/$label.log" 2>&1
  python3 - "$label" "$before" "$(jit "$jd")" <<'PY' 2>&1
import json, sys
l, b, a = sys.argv[1:]; d = json.load(open(f"/tmp/m/{l}/train.json"))
print(f"{l:26s} {d.get('compile_cache')!s:9s} first {d['first_epoch_s']:.2f} s  steady {d['steady_epoch_s']:.4f} s {[round(x, 4) for x in d.get('steady_epochs_s') or []]}  JIT files {b} -> {a}")
PY
  grep -h "JIT\|done in" "$R/$label.log"
}
fresh() { git clone -q "$W" "$1" && mkdir -p "$1/compile-cache" && cp /tmp/bins/*.bin "$1/compile-cache/"; python3 "$D/evict.py" > /dev/null; }
J=.accelbench/cuda-jit-cache
mkdir -p /tmp/m /tmp/bins; git clone -q "$W" /tmp/A; mkdir -p /tmp/A/compile-cache
train /tmp/A A-gpu-cold gpu /tmp/d3.yaml /tmp/A/$J
train /tmp/A A-amp-cold amp /tmp/d3.yaml /tmp/A/$J
cp /tmp/A/compile-cache/*.bin /tmp/bins/; ls -la /tmp/bins
rm -rf /tmp/A; fresh /tmp/A
train /tmp/A A2-gpu-same-path gpu /tmp/d3.yaml /tmp/A/$J
train /tmp/A A2-amp-same-path amp /tmp/d3.yaml /tmp/A/$J
fresh /tmp/C2; train /tmp/C2 C2-gpu-cachepath-of-A gpu /tmp/d3.yaml /tmp/A/$J CUDA_CACHE_PATH=/tmp/A/$J
fresh /tmp/C3; train /tmp/C3 C3-amp-nobench-new-path amp /tmp/d3nb.yaml /tmp/C3/$J
train /tmp/C3 C3-amp-nobench-warm amp /tmp/d3nb.yaml /tmp/C3/$J
date
cd "$OUT" && tar czf r.tgz r && rm -rf r
