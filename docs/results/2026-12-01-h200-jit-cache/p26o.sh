#!/usr/bin/env bash
# #26: the JIT cache restored from gpu.bin was not reused (p26n: every new clone JIT-built
# 14 entries of the same sizes again). Packed too early (before the driver wrote them all),
# or keyed by the clone's path? A: cold; its JIT folder copied after the process ended.
# B: a new clone whose CUDA_CACHE_PATH is that post-exit copy. A2: A deleted and re-cloned
# at the same path, JIT restored from gpu.bin. C: a new clone, restored from gpu.bin.
set -uo pipefail
: "${OUT:?}"
W=$PWD; D=$(cd .. && pwd); R=$OUT/r; mkdir -p "$R"
rm -rf /tmp/P /tmp/A /tmp/B /tmp/C /tmp/jit* /tmp/site /tmp/m /tmp/pk
exec > >(tee "$R/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date
export ACCELBENCH_MNIST_MIRROR=$D/mnist
ln -sfn ../.whl .whl
source benchmarks/gpu-host-setup.sh > "$R/setup.log" 2>&1
git clone -q "$W" /tmp/P && (cd /tmp/P && dvc repro prepare > "$R/prepare.log" 2>&1)
sed 's/^  epochs: 10/  epochs: 3/' /tmp/P/params.yaml > /tmp/d3.yaml
jit() { find "${1}" -type f 2>/dev/null | wc -l; }
train() {  # dir label jitdir [env...]
  local dir=$1 label=$2 jd=$3; shift 3
  cd "$dir"; local before; before=$(jit "$jd")
  env "$@" accelbench --params /tmp/d3.yaml train gpu --data /tmp/P/data/prepared --model /tmp/m/$label.pt \
    --metrics /tmp/m/$label --compile-cache compile-cache/gpu.bin --quiet > "$R/$label.log" 2>&1
  python3 - "$label" "$before" "$(jit "$jd")" <<'PY' 2>&1
import json, sys
l, b, a = sys.argv[1:]; d = json.load(open(f"/tmp/m/{l}/train.json"))
print(f"{l:24s} {d.get('compile_cache')!s:9s} first {d['first_epoch_s']:.2f} s  steady {d['steady_epoch_s']:.4f} s  JIT files {b} -> {a}")
PY
  grep -h "JIT" "$R/$label.log"
  find "$jd" -type f -printf '%s %P\n' 2>/dev/null | sort -k2 > "$R/$label.jit"
}
fresh() { git clone -q "$W" "$1" && mkdir -p "$1/compile-cache" && cp /tmp/gpu.bin "$1/compile-cache/"; python3 "$D/evict.py" > /dev/null; }
mkdir -p /tmp/m; git clone -q "$W" /tmp/A; mkdir -p /tmp/A/compile-cache
J=.accelbench/cuda-jit-cache
train /tmp/A A-cold /tmp/A/$J
cp /tmp/A/compile-cache/gpu.bin /tmp/gpu.bin; cp -a /tmp/A/$J /tmp/jitA
python3 - <<'PY'
import io, json, tarfile
data = open("/tmp/gpu.bin", "rb").read(); line, _, rest = data.partition(b"\n"); h = json.loads(line)
tar = tarfile.open(fileobj=io.BytesIO(rest[h["bytes"]:]), mode="r:gz")
print("packed:", h["jit"], sorted((m.name, m.size) for m in tar.getmembers() if m.isfile()))
PY
echo "post-exit folder:"; cat "$R/A-cold.jit"
fresh /tmp/B; train /tmp/B B-postexit-copy /tmp/jitA CUDA_CACHE_PATH=/tmp/jitA
rm -rf /tmp/A; fresh /tmp/A; train /tmp/A A2-same-path-restored /tmp/A/$J
fresh /tmp/C; train /tmp/C C-new-path-restored /tmp/C/$J
train /tmp/C C-warm /tmp/C/$J
date
cd "$OUT" && tar czf r.tgz r && rm -rf r
