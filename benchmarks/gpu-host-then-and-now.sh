#!/usr/bin/env bash
# Has the code moved a compiled variant's epochs since a base commit, on this host? Issue 39
# asks for cold first epochs of gpu and amp cut with steady epochs within 5% of the issue's;
# runs of record on different hosts of one GPU model differ by up to 10% (docs/results/
# 2026-12-01-h200.md), so only the same host can say. Three arms, alternated, each a fresh
# `accelbench train` process with empty Inductor, Triton and CUDA JIT caches, 6 epochs, one
# seed:
#   base:  the base commit's code, params and prepared data;
#   now:   this checkout's;
#   tuned: this checkout's code with the base's two compile settings back (Triton kernel
#          autotuning and cudnn.benchmark, which issue 39's work turned off for gpu and amp).
# The base comes in .rec/base, as the lent host has no history:
#   mkdir -p .rec/base && git archive BASE src params.yaml | tar -x -C .rec/base
#   git rev-parse --short BASE > .rec/base/COMMIT
# Run from the repository root on a lent GPU host, in one `run` call (about 6 minutes):
#   bash benchmarks/gpu-host-then-and-now.sh
set -uo pipefail
export ACCELBENCH_MNIST_MIRROR=$PWD/.rec/mnist
base=$PWD/.rec/base
[ -f "$base/params.yaml" ] || { echo "no $base/params.yaml: see this script's head"; exit 1; }
began=$(date +%s)
source benchmarks/gpu-host-setup.sh > "$OUT/setup.log" 2>&1
{ host_facts; echo "base $(cat "$base/COMMIT" 2>/dev/null)"; } | tee "$OUT/env.txt"
work=/tmp/then-and-now
mkdir -p "$work/base-data"
dvc repro prepare >> "$OUT/setup.log" 2>&1 || { tail -5 "$OUT/setup.log"; exit 1; }
python3 - "$base/params.yaml" params.yaml "$work" <<'EOF' || exit 1
import sys, yaml
base, now, work = sys.argv[1:]
for arm, path in (("base", base), ("now", now), ("tuned", now)):
    raw = yaml.safe_load(open(path))
    raw["train"].update(epochs=6, repeats=1)
    for variant in raw["variants"].values():
        variant.pop("epochs", None), variant.pop("repeats", None)
    if arm == "tuned":
        for name in ("gpu", "amp"):
            raw["variants"][name].update(kernel_autotune=True, cudnn_benchmark=True)
    yaml.safe_dump(raw, open(f"{work}/{arm}.yaml", "w"), sort_keys=False)
    print(arm, {n: {k: v for k, v in raw["variants"][n].items() if k != "device"} for n in ("gpu", "amp")})
EOF
(cd "$work/base-data" && PYTHONPATH=/tmp/site:$base/src python3 -m accelbench.cli \
  --params "$work/base.yaml" download --out raw && PYTHONPATH=/tmp/site:$base/src python3 -m \
  accelbench.cli --params "$work/base.yaml" prepare --raw raw --out prepared) \
  >> "$OUT/setup.log" 2>&1 || { tail -5 "$OUT/setup.log"; exit 1; }
python3 benchmarks/step_options.py amp_uncompiled:base --epochs 2 > /dev/null 2>&1  # not timed

train() {  # arm, variant, trial: one JSON line
  local arm=$1 variant=$2 trial=$3 dir=$work/$1-$2-$3 src=$PWD/src data=$PWD/data/prepared t0
  [ "$arm" = base ] && src=$base/src data=$work/base-data/prepared
  mkdir -p "$dir/cache"
  t0=$(date +%s%N)
  (cd "$dir" && PYTHONPATH=/tmp/site:$src TORCHINDUCTOR_CACHE_DIR=$dir/cache \
    TRITON_CACHE_DIR=$dir/cache/triton CUDA_CACHE_PATH=$dir/cache/jit \
    MLFLOW_TRACKING_URI=sqlite:///$dir/mlflow.db python3 -m accelbench.cli \
    --params "$work/$arm.yaml" train "$variant" --data "$data" --model "$dir/model.pt" \
    --metrics "$dir" --quiet) > "$dir/log" 2>&1
  local rc=$? ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  python3 - "$dir/epochs.csv" "$arm" "$variant" "$trial" "$rc" "$ms" <<'EOF'
import csv, json, statistics, sys
path, arm, variant, trial, rc, ms = sys.argv[1:]
try:
    rows = list(csv.DictReader(open(path)))
except OSError:
    rows = []
times = [float(r["train_time_s"]) for r in rows]
print(json.dumps({"arm": arm, "variant": variant, "trial": int(trial), "rc": int(rc),
                  "process_s": int(ms) / 1000, "first_s": times[0] if times else None,
                  "steady_s": statistics.median(times[1:]) if len(times) > 1 else None,
                  "steady_epochs_s": times[1:],
                  "accuracy": float(rows[-1]["test_accuracy"]) if rows else None}))
EOF
  [ "$rc" = 0 ] || tail -5 "$dir/log" >&2
}
start=$began
for trial in 1 2; do
  for variant in amp gpu; do
    for arm in base now tuned; do
      # a run takes up to 40 s: none starts that could outlast the call (DEADLINE_S: when
      # less device time is left than its 600 s)
      [ $(( $(date +%s) - start)) -lt "${DEADLINE_S:-500}" ] || { echo "out of time" >&2; break 3; }
      train "$arm" "$variant" "$trial"
    done
  done
done | tee "$OUT/runs.jsonl"
python3 - "$OUT/runs.jsonl" <<'EOF' | tee "$OUT/summary.txt"
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
for variant in ("amp", "gpu"):
    base = None
    for arm in ("base", "now", "tuned"):
        mine = [r for r in runs if (r["arm"], r["variant"]) == (arm, variant) and r["rc"] == 0]
        if not mine:
            print(f"{variant} {arm}: no run"); continue
        steady = statistics.median(s for r in mine for s in r["steady_epochs_s"])
        base = steady if arm == "base" else base
        vs = f", {100 * (steady / base - 1):+.1f}% vs base" if base and arm != "base" else ""
        print(f"{variant} {arm}: first epochs " + ", ".join(f"{r['first_s']:.2f}" for r in mine)
              + f" s; steady {steady * 1000:.1f} ms (median of {sum(len(r['steady_epochs_s']) for r in mine)})"
              + vs + "; process " + ", ".join(f"{r['process_s']:.1f}" for r in mine) + " s")
EOF
tar czf "$OUT/runs.tgz" -C "$work" $(cd "$work" && ls -d */log */epochs.csv */train.json 2>/dev/null)
