#!/usr/bin/env bash
# Is a compiled variant's cold first epoch longer inside its train stage than in
# step_options.py's bare loop, on the same host? Alternates the two, each a fresh process
# with empty Inductor, Triton and CUDA JIT caches, 4 epochs, one seed. Run from the
# repository root on a lent GPU host, in one `run` call (about 4 minutes; logs to $OUT):
#   bash benchmarks/gpu-host-stage-vs-bare.sh
set -uo pipefail
export ACCELBENCH_MNIST_MIRROR=$PWD/.rec/mnist
source benchmarks/gpu-host-setup.sh > "$OUT/setup.log" 2>&1
host_facts | tee "$OUT/env.txt"
dvc repro prepare >> "$OUT/setup.log" 2>&1
sed -e 's/^  epochs: 10$/  epochs: 4/' -e 's/^  repeats: 3$/  repeats: 1/' params.yaml > /tmp/p4.yaml
grep -E '^  (epochs|repeats):' /tmp/p4.yaml
# The first process on the host reads torch's CUDA libraries from disk: how long reading what
# the set-up left unread takes alone, then a first process that is not timed.
libs=$(python3 -c "from importlib.util import find_spec as f; print(*f('nvidia').submodule_search_locations, f('torch').submodule_search_locations[0] + '/lib')")
[ -n "$libs" ] || { echo "no CUDA libraries found beside torch: nothing to time"; exit 1; }
t0=$(date +%s%N); find $libs -name '*.so*' -type f -exec cat {} + | wc -c | tee "$OUT/libs.txt"
echo "read in $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$OUT/libs.txt"
python3 benchmarks/step_options.py amp_uncompiled:base --epochs 2 > "$OUT/warm.jsonl" 2>&1
stage() {  # variant, trial
  local dir=/tmp/stage-$1-$2 cache; cache=$(mktemp -d)
  local t0; t0=$(date +%s%N)
  TORCHINDUCTOR_CACHE_DIR=$cache TRITON_CACHE_DIR=$cache/triton CUDA_CACHE_PATH=$cache/jit \
    accelbench --params /tmp/p4.yaml train "$1" --data data/prepared --model "$dir/model.pt" \
    --metrics "$dir" --quiet > "$OUT/stage-$1-$2.log" 2>&1
  echo "{\"stage\": \"$1\", \"trial\": $2, \"rc\": $?, \"process_ms\": $(( ($(date +%s%N) - t0) / 1000000 ))}"
  cp "$dir/epochs.csv" "$OUT/stage-$1-$2-epochs.csv"; cp "$dir/train.json" "$OUT/stage-$1-$2-train.json"
  rm -rf "$cache"
}
for trial in 1 2; do
  for variant in gpu amp; do
    python3 benchmarks/step_options.py "$variant:base" --params /tmp/p4.yaml --epochs 4 2>&1 | tail -1
    stage "$variant" "$trial"
  done
done | tee "$OUT/runs.jsonl"
