#!/usr/bin/env bash
# Issue 26 part 2 on one H200: machine A trains the compiled variants from cold caches and
# leaves compile-cache/*.bin; machine B (a fresh clone, every compile cache of this host
# emptied) gets only those files, as `dvc pull` would, and runs a whole fresh `dvc repro`;
# then C: B's compiled stages again with B's own caches warm.
set -uo pipefail
: "${OUT:?}"
W=$PWD
export ACCELBENCH_MNIST_MIRROR=$W/../mnist
ln -sfn ../.whl .whl
source benchmarks/gpu-host-setup.sh > "$OUT/setup.log" 2>&1
python3 - > "$OUT/versions.txt" 2>&1 <<'PY'
import platform, torch, triton
print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda,
      "gpu", torch.cuda.get_device_name(), "python", platform.python_version())
PY
nvidia-smi --query-gpu=name,driver_version --format=csv >> "$OUT/versions.txt"
nproc >> "$OUT/versions.txt"
empty_host_caches() { rm -rf ~/.triton ~/.nv/ComputeCache /tmp/torchinductor_* ~/.cache/torch/kernels; }
secs() { python3 -c "import time,sys; print(round(time.time()-float(sys.argv[1]),1))" "$1"; }

empty_host_caches
git clone -q "$W" /tmp/A && cd /tmp/A
s=$(date +%s.%N)
timeout 200 dvc repro train@gpu train@amp > "$OUT/A-repro.log" 2>&1; echo "rc=$? wall=$(secs $s) s" >> "$OUT/A-repro.log"
mkdir -p "$OUT/A"; cp metrics/gpu/train.json "$OUT/A/gpu.train.json"; cp metrics/amp/train.json "$OUT/A/amp.train.json"
ls -l compile-cache >> "$OUT/A-repro.log"; head -1 compile-cache/gpu.bin >> "$OUT/A-repro.log"; echo >> "$OUT/A-repro.log"

empty_host_caches
git clone -q "$W" /tmp/B && cd /tmp/B
mkdir compile-cache && cp /tmp/A/compile-cache/gpu.bin /tmp/A/compile-cache/amp.bin compile-cache/
s=$(date +%s.%N)
timeout 310 dvc repro > "$OUT/B-repro.log" 2>&1; echo "rc=$? wall=$(secs $s) s" >> "$OUT/B-repro.log"
tar czf "$OUT/B.tgz" reports env metrics dvc.lock .accelbench/timings compile-cache 2>/dev/null
s=$(date +%s.%N)
timeout 90 dvc repro -f -s train@gpu train@amp > "$OUT/C-repro.log" 2>&1; echo "rc=$? wall=$(secs $s) s" >> "$OUT/C-repro.log"
mkdir -p "$OUT/C"; cp metrics/gpu/train.json "$OUT/C/gpu.train.json"; cp metrics/amp/train.json "$OUT/C/amp.train.json"
