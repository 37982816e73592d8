#!/usr/bin/env bash
# step_options.py's candidates on one fresh lent GPU, in one `run` call: set up from the
# wheelhouse, `dvc repro prepare`, then each candidate in its own process with cold caches
# (4 epochs); with PROFILE="CANDIDATE...", those again for 2 epochs with a step profile.
#   bash benchmarks/gpu-host-candidates.sh amp:base amp:forcelayout gpu:base gpu:forcelayout
# Run from the repository root; logs to $OUT. Name each candidate twice, interleaved, to see
# the host's own spread.
set -uo pipefail
export ACCELBENCH_MNIST_MIRROR=$PWD/.rec/mnist
t0=$(date +%s)
source benchmarks/gpu-host-setup.sh > "$OUT/setup.log" 2>&1
echo "setup $(( $(date +%s) - t0 )) s"
host_facts | tee "$OUT/env.txt"
dvc repro prepare >> "$OUT/setup.log" 2>&1; echo "prepare rc $?"
python3 benchmarks/step_options.py "$@" --epochs 4 2>&1 | tee "$OUT/step-options.jsonl"
echo "candidates done $(( $(date +%s) - t0 )) s"
if [[ -n ${PROFILE:-} ]]; then
  # shellcheck disable=SC2086  # PROFILE holds several candidates
  python3 benchmarks/step_options.py $PROFILE --epochs 2 --profile "$OUT/profiles" 2>&1 \
    | tee "$OUT/profiled.jsonl"
fi
echo "total $(( $(date +%s) - t0 )) s"
