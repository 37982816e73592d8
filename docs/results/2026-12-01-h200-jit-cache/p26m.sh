#!/usr/bin/env bash
# #26: the CUDA JIT cache carried in compile-cache/<variant>.bin. Micro checks of the driver's
# cache, then: A trains gpu and amp cold (writes the .bin files with the JIT cache); fresh
# clones at new paths get only a .bin, with the libraries evicted from the page cache:
# B1 gpu (JIT restored), B2 gpu with a user's empty CUDA_CACHE_PATH (not restored), B3 amp;
# then cudnn_benchmark false: steady epochs in A (warm) and B4's portable first epoch.
set -uo pipefail
: "${OUT:?}"
W=$PWD; D=$(cd .. && pwd); R=$OUT/r; mkdir -p "$R"
rm -rf /tmp/P /tmp/A /tmp/B1 /tmp/B2 /tmp/B3 /tmp/B4 /tmp/jc* /tmp/site /tmp/m
exec > >(tee "$R/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date
echo "== micro (bare conv2 of the CNN, torch from the host image)"
CUDA_CACHE_PATH=/tmp/jcA python3 "$D/conv2.py" a-cold-jit
CUDA_CACHE_PATH=/tmp/jcA python3 "$D/conv2.py" a-again
cp -r /tmp/jcA /tmp/jcC; CUDA_CACHE_PATH=/tmp/jcC python3 "$D/conv2.py" c-copied-to-new-path
CUDA_CACHE_PATH=/tmp/jcB python3 "$D/lazy.py" /tmp/jcA
CUDA_CACHE_PATH=/tmp/jcD python3 "$D/conv2.py" d-empty-jit-nobench nobench
du -sh /tmp/jcA; ls /tmp/jcA | head
echo "== pipeline"
export ACCELBENCH_MNIST_MIRROR=$D/mnist
ln -sfn ../.whl .whl
t=$(date +%s); source benchmarks/gpu-host-setup.sh > "$R/setup.log" 2>&1; echo "setup $(( $(date +%s) - t )) s"
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.backends.cudnn.version())"
git clone -q "$W" /tmp/P && (cd /tmp/P && dvc repro prepare > "$R/prepare.log" 2>&1)
sed 's/^  epochs: 10/  epochs: 4/' /tmp/P/params.yaml > /tmp/d4.yaml
sed 's/cudnn_benchmark: true/cudnn_benchmark: false/' /tmp/d4.yaml > /tmp/d4nb.yaml
train() {  # dir label variant params [env...]
  local dir=$1 label=$2 v=$3 p=$4; shift 4
  cd "$dir"; s=$(date +%s.%N)
  env "$@" accelbench --params "$p" train "$v" --data /tmp/P/data/prepared --model /tmp/m/$label.pt \
    --metrics /tmp/m/$label --compile-cache compile-cache/$v.bin --quiet > "$R/$label.log" 2>&1
  echo "rc=$? process $(python3 -c "import time,sys; print(round(time.time()-float(sys.argv[1]),1))" $s) s" >> "$R/$label.log"
  python3 - "$label" <<'PY' 2>&1
import json, sys
l = sys.argv[1]; d = json.load(open(f"/tmp/m/{l}/train.json"))
print(f"{l:28s} {d.get('compile_cache')!s:9s} first {d['first_epoch_s']:.2f} s  steady {d['steady_epoch_s']:.4f} s  steady {[round(x,4) for x in d.get('steady_epochs_s') or []]}")
PY
  grep -h "JIT\|compile cache" "$R/$label.log" | head -3
}
fresh() { git clone -q "$W" "$1" && mkdir -p "$1/compile-cache" && cp "/tmp/A/compile-cache/$2.bin" "$1/compile-cache/"; python3 "$D/evict.py" > /dev/null; }
mkdir -p /tmp/m; git clone -q "$W" /tmp/A; mkdir -p /tmp/A/compile-cache
train /tmp/A A-gpu-cold gpu /tmp/d4.yaml
train /tmp/A A-amp-cold amp /tmp/d4.yaml
for v in gpu amp; do head -c 300 /tmp/A/compile-cache/$v.bin | head -1; echo; ls -la /tmp/A/compile-cache/$v.bin; done
du -sh /tmp/A/.accelbench/cuda-jit-cache
fresh /tmp/B1 gpu; train /tmp/B1 B1-gpu-portable-jit gpu /tmp/d4.yaml
fresh /tmp/B2 gpu; train /tmp/B2 B2-gpu-portable-nojit gpu /tmp/d4.yaml CUDA_CACHE_PATH=/tmp/jcE
fresh /tmp/B3 amp; train /tmp/B3 B3-amp-portable-jit amp /tmp/d4.yaml
train /tmp/B1 B1-gpu-warm gpu /tmp/d4.yaml
train /tmp/A A-gpu-warm-nobench gpu /tmp/d4nb.yaml
train /tmp/A A-amp-warm-nobench amp /tmp/d4nb.yaml
train /tmp/A A-amp-warm amp /tmp/d4.yaml
fresh /tmp/B4 gpu; train /tmp/B4 B4-gpu-portable-nojit-nobench gpu /tmp/d4nb.yaml CUDA_CACHE_PATH=/tmp/jcF
date
cd "$OUT" && tar czf r.tgz r && rm -rf r
