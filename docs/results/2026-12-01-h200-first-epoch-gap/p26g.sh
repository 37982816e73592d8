#!/usr/bin/env bash
# Where the portable-vs-warm gap goes (p26e/f were spoiled: a script variable named CC
# replaced the host's exported C compiler). Cold training (C) makes gpu.bin and a warm cache;
# portable runs in fresh clones given gpu.bin alone (P1, P3) or gpu.bin plus C's Triton
# folder (P2); warm (C again, P1 again). 2-epoch gpu trainings, every thread sampled.
set -uo pipefail
: "${OUT:?}"
W=$PWD
R=$OUT/r; mkdir -p $R
rm -rf /tmp/P /tmp/C /tmp/P1 /tmp/P2 /tmp/P3 /tmp/P4 /tmp/P5
export ACCELBENCH_MNIST_MIRROR=$W/../mnist
ln -sfn ../.whl .whl
source benchmarks/gpu-host-setup.sh > "$R/setup.log" 2>&1
{ env | grep -E '^(CC|CXX|PATH)='; python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.cuda.get_device_name())"; } > "$R/versions.txt" 2>&1
git clone -q "$W" /tmp/P && cd /tmp/P && dvc repro prepare > "$R/prepare.log" 2>&1
sed 's/^  epochs: 10/  epochs: 2/' params.yaml > /tmp/d.yaml
train() {  # $1 clone dir, $2 label, $3 sampler (1/0)
  cd "$1"
  s=$(date +%s.%N)
  if [ "$3" = 1 ]; then run=(python3 "$W/../sampler.py"); else run=(accelbench); fi
  SAMPLE_OUT=$R/$2 ACCELBENCH_DEBUG=1 "${run[@]}" --params /tmp/d.yaml train gpu --data /tmp/P/data/prepared \
    --model /tmp/$2.pt --metrics /tmp/$2 --compile-cache compile-cache/gpu.bin --quiet > "$R/$2.log" 2>&1
  echo "rc=$? process $(python3 -c "import time,sys; print(round(time.time()-float(sys.argv[1]),1))" $s) s" >> "$R/$2.log"
  python3 -c "import json; d=json.load(open('/tmp/$2/train.json')); print('$2', d.get('compile_cache'), round(d['first_epoch_s'],2))" >> "$R/summary.txt" 2>&1
}
fresh() { git clone -q "$W" "$1" && mkdir -p "$1/compile-cache" && cp "$2" "$1/compile-cache/gpu.bin"; }
git clone -q "$W" /tmp/C; mkdir -p /tmp/C/compile-cache; train /tmp/C cold 0
cp /tmp/C/compile-cache/gpu.bin $R/gpu.bin
CACHE_C=/tmp/C/.accelbench/compile-cache
train /tmp/C warmC 1
fresh /tmp/P1 $R/gpu.bin; train /tmp/P1 portable1 1
train /tmp/P1 warm1 1
fresh /tmp/P2 $R/gpu.bin; mkdir -p /tmp/P2/.accelbench/compile-cache && cp -a $CACHE_C/triton /tmp/P2/.accelbench/compile-cache/; train /tmp/P2 portable-plus-triton 1
fresh /tmp/P3 $R/gpu.bin; train /tmp/P3 portable3 1
(cd $CACHE_C && find . -type f | sed 's|^\./||; s|/.*||' | sort | uniq -c) > $R/C-cache-top.txt 2>&1
(cd /tmp/P3/.accelbench/compile-cache && find . -type f | sed 's|^\./||; s|/.*||' | sort | uniq -c) > $R/P3-cache-top.txt 2>&1
cat "$R/summary.txt"
cd $OUT && tar czf r.tgz r && rm -rf r
