#!/usr/bin/env bash
# Why a portable first epoch is slower than a warm one: the same 2-epoch gpu training in
# fresh clones given machine 1's gpu.bin, with Inductor's compile workers as they are and
# with TORCHINDUCTOR_COMPILE_THREADS=1; then warm (the second clone again).
set -uo pipefail
: "${OUT:?}"
W=$PWD
export ACCELBENCH_MNIST_MIRROR=$W/../mnist
ln -sfn ../.whl .whl
source benchmarks/gpu-host-setup.sh > "$OUT/setup.log" 2>&1
git clone -q "$W" /tmp/P && cd /tmp/P && dvc repro prepare > "$OUT/prepare.log" 2>&1
sed 's/^  epochs: 10/  epochs: 2/' params.yaml > /tmp/d.yaml
train() {  # $1 clone, $2 label, then env assignments
  local dir=$1 label=$2; shift 2
  cd "$dir"
  s=$(date +%s.%N)
  env "$@" accelbench --params /tmp/d.yaml train gpu --data /tmp/P/data/prepared --model /tmp/$label.pt \
    --metrics /tmp/$label --compile-cache compile-cache/gpu.bin --quiet > "$OUT/$label.log" 2>&1
  echo "rc=$? process $(python3 -c "import time,sys; print(round(time.time()-float(sys.argv[1]),1))" $s) s" >> "$OUT/$label.log"
  python3 -c "import json; d=json.load(open('/tmp/$label/train.json')); t=json.load(open('.accelbench/timings/train@gpu.json')); print('$label', d['compile_cache'], round(d['first_epoch_s'],2), {k: round(v,2) for k,v in t['phases'].items() if v>0.2})" >> "$OUT/summary.txt"
}
for label in threads1 default; do
  git clone -q "$W" /tmp/$label-ws && cd /tmp/$label-ws && tar xzf "$W/../cc1.tgz"
done
train /tmp/threads1-ws threads1 TORCHINDUCTOR_COMPILE_THREADS=1
train /tmp/default-ws default X=1
train /tmp/default-ws warm X=1
train /tmp/threads1-ws warm-threads1 TORCHINDUCTOR_COMPILE_THREADS=1
cat "$OUT/summary.txt"
