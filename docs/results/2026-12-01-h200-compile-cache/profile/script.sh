#!/usr/bin/env bash
# Issue 26 parts 2 and 3 on one H200, a machine other than the one that made the cache:
# a fresh clone given only compile-cache/*.bin from that machine (cc1.tgz), a whole fresh
# `dvc repro`, every stage's phases kept; then the import and MLflow costs alone.
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
secs() { python3 -c "import time,sys; print(round(time.time()-float(sys.argv[1]),1))" "$1"; }
# where a portable first epoch goes: one gpu training (2 epochs) under cProfile, in a fresh
# clone whose own caches are empty, given the other machine's gpu.bin
cd /tmp && git clone -q "$W" /tmp/D && cd /tmp/D
tar xzf "$W/../cc1.tgz"
dvc repro prepare > "$OUT/D-prepare.log" 2>&1
sed 's/^  epochs: 10/  epochs: 2/' params.yaml > /tmp/d.yaml
python3 -m cProfile -o "$OUT/gpu.prof" -m accelbench.cli --params /tmp/d.yaml train gpu \
  --data data/prepared --model /tmp/d-gpu.pt --metrics /tmp/d-metrics --quiet \
  --compile-cache compile-cache/gpu.bin > "$OUT/D-train.log" 2>&1
python3 - "$OUT/gpu.prof" > "$OUT/gpu-prof.txt" <<'PY'
import pstats, sys
s = pstats.Stats(sys.argv[1]); s.sort_stats("cumulative").print_stats(70)
s.sort_stats("tottime").print_stats(30)
PY
ls -la /tmp/D/.accelbench/compile-cache /tmp/D/.accelbench/compile-cache/triton 2>&1 | head -30 > "$OUT/D-caches.txt"

# and the same on this machine again: its own caches warm now
cd /tmp/D && python3 -m cProfile -o "$OUT/gpu-warm.prof" -m accelbench.cli --params /tmp/d.yaml train gpu \
  --data data/prepared --model /tmp/d-gpu.pt --metrics /tmp/d-metrics2 --quiet \
  --compile-cache compile-cache/gpu.bin > "$OUT/D-train-warm.log" 2>&1
python3 - "$OUT/gpu-warm.prof" > "$OUT/gpu-warm-prof.txt" <<'PY'
import pstats, sys
s = pstats.Stats(sys.argv[1]); s.sort_stats("cumulative").print_stats(70)
PY
cp /tmp/d-metrics/train.json "$OUT/portable.train.json"; cp /tmp/d-metrics2/train.json "$OUT/warm.train.json"
cp .accelbench/timings/train@gpu.json "$OUT/warm.timing.json" 2>/dev/null
