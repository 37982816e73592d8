#!/usr/bin/env bash
# Where a train stage's seconds go outside its training, on an air-gapped GPU host: the
# stage of VARIANT (default amp_uncompiled) run as `dvc repro` runs it, twice plainly (its
# phases), once under `python -X importtime` (what each import costs) and once under
# cProfile (which calls the rest is), each a fresh process; then the evaluate stage under
# cProfile, and how long a SQLite commit takes in the workspace (MLflow's store). Needs the
# wheelhouse in .whl and MNIST in $ACCELBENCH_MNIST_MIRROR. Everything lands in $OUT.
set -euo pipefail
OUT="${OUT:-$PWD/gpu-run}"
V="${1:-amp_uncompiled}"
mkdir -p "$OUT"
source benchmarks/gpu-host-setup.sh
dvc repro prepare > "$OUT/prepare.log" 2>&1
train() {
  local tag=$1; shift
  local start; start=$(date +%s.%N)
  python3 "$@" -m accelbench.cli train "$V" --data data/prepared --model "/tmp/$tag/model.pt" \
    --metrics "/tmp/$tag" --quiet 2> "$OUT/$tag.stderr"
  python3 -c "import sys; print(f'$tag: {float(sys.argv[2]) - float(sys.argv[1]):.2f} s from process start')" \
    "$start" "$(date +%s.%N)" | tee -a "$OUT/walls.txt"
  cp ".accelbench/timings/train@$V.json" "$OUT/$tag-timings.json"
}
train plain1
train plain2
train importtime -X importtime
# cli.main with argv given returns instead of ending the process (cProfile writes at return)
profiled() { python3 -c 'import cProfile, sys; from accelbench.cli import main
cProfile.run("main(sys.argv[2:])", sys.argv[1])' "$@"; }
profiled "$OUT/train.prof" train "$V" --data data/prepared --model /tmp/cprofile/model.pt \
  --metrics /tmp/cprofile --quiet 2> "$OUT/cprofile.stderr"
cp ".accelbench/timings/train@$V.json" "$OUT/cprofile-timings.json"
profiled "$OUT/evaluate.prof" evaluate --model /tmp/plain1/model.pt --data data/prepared \
  --metrics /tmp/eval > "$OUT/evaluate.log" 2>&1
python3 - <<'EOF' | tee "$OUT/sqlite.txt"
import sqlite3, time, os
for where in (".", "/dev/shm"):
    path = os.path.join(where, "commit-probe.db")
    db = sqlite3.connect(path)
    db.execute("create table if not exists t (x)")
    start = time.perf_counter()
    for i in range(50):
        db.execute("insert into t values (?)", (i,))
        db.commit()
    print(f"sqlite commit in {os.path.realpath(where)}: {(time.perf_counter() - start) / 50 * 1e3:.2f} ms")
    db.close(); os.remove(path)
EOF
# what comes back is limited in files: one archive
tar czf "$OUT.tgz" -C "$OUT" . && rm -rf "$OUT" && mkdir -p "$OUT" && mv "$OUT.tgz" "$OUT/"
