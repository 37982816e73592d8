#!/usr/bin/env bash
# #26: compile-cache files in format /3 (torch's artifacts xz-compressed) made and reused on
# one H200: a cold `dvc repro train@gpu train@amp` in a fresh clone at /tmp/W, then a new
# clone at the same path given only compile-cache/{gpu,amp}.bin.
set -uo pipefail
: "${OUT:?}"
W=$PWD; D=$W/.rec3; R=$OUT/t; mkdir -p "$R"
cd /; rm -rf /tmp/W /tmp/site /tmp/bins
exec > >(tee "$R/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date
export ACCELBENCH_MNIST_MIRROR=$D/mnist
cd "$W"; ln -sfn .rec3/.whl .whl
source benchmarks/gpu-host-setup.sh > "$R/setup.log" 2>&1
show() {
  for v in gpu amp; do python3 - "$v" <<'PY'
import json, sys
v = sys.argv[1]
h = json.loads(open(f"compile-cache/{v}.bin", "rb").readline())
d = json.load(open(f"metrics/{v}/train.json"))
t = json.load(open(f".accelbench/timings/train@{v}.json"))["phases"]
print(f"{v}: {h['format']} stored {h['bytes']} raw {h.get('raw_bytes')} jit {h['jit'] and h['jit']['files']}"
      f" | first {d['first_epoch_s']:.2f} s ({d['compile_cache']}) steady {d['steady_epoch_s']:.4f}"
      f" | outputs phase {t.get('outputs', 0):.2f} s")
PY
  done
}
git clone -q "$W" /tmp/W && cd /tmp/W
s=$(date +%s.%N); dvc repro train@gpu train@amp > "$R/cold.log" 2>&1; echo "cold rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"
show; mkdir /tmp/bins; cp compile-cache/gpu.bin compile-cache/amp.bin /tmp/bins/
cd /; rm -rf /tmp/W; git clone -q "$W" /tmp/W && mkdir -p /tmp/W/compile-cache && cp /tmp/bins/*.bin /tmp/W/compile-cache/ && cd /tmp/W
s=$(date +%s.%N); dvc repro train@gpu train@amp > "$R/portable.log" 2>&1; echo "portable rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"
grep -h "JIT\|compile cache\|AccumulateGrad" "$R/portable.log"; show
date
cd "$OUT" && tar czf t.tgz t && rm -rf t
