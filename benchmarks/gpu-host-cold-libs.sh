#!/usr/bin/env bash
# Does reading torch's CUDA libraries from disk land in a compiled variant's first epoch? The
# first CUDA stage of a fresh machine's `dvc repro` finds them outside the page cache. For gpu
# and amp, twice each: step_options.py's bare loop (2 epochs, cold compile caches) with the
# libraries evicted from the page cache (posix_fadvise DONTNEED: no root needed), then again
# with them cached. Then what a CUDA process maps after one small convolution and matmul, how
# long those take with the libraries evicted and cached, and what an NVML energy read costs.
# Run from the repository root on a lent GPU host, in one `run` call (about 3 minutes; logs
# to $OUT):
#   bash benchmarks/gpu-host-cold-libs.sh
set -uo pipefail
export ACCELBENCH_MNIST_MIRROR=$PWD/.rec/mnist
source benchmarks/gpu-host-setup.sh > "$OUT/setup.log" 2>&1
host_facts | tee "$OUT/env.txt"
dvc repro prepare >> "$OUT/setup.log" 2>&1
libs=$(python3 -c "from importlib.util import find_spec as f; print(*f('nvidia').submodule_search_locations, f('torch').submodule_search_locations[0] + '/lib')")
[ -n "$libs" ] || { echo "no CUDA libraries found beside torch: nothing to time"; exit 1; }
evict() {  # drop the libraries' pages from the page cache (read_all times reading them back)
  find $libs -name '*.so*' -type f -print0 | python3 -c "
import os, sys
for p in sys.stdin.read().split('\0')[:-1]:
    fd = os.open(p, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)"
}
read_all() { local t0; t0=$(date +%s%N); find $libs -name '*.so*' -type f -exec cat {} + | wc -c
  echo "read in $(( ($(date +%s%N) - t0) / 1000000 )) ms"; }
{ evict; echo "evicted:"; read_all; echo "cached:"; read_all; } 2>&1 | tee "$OUT/libs.txt"
python3 benchmarks/step_options.py amp_uncompiled:base --epochs 2 > "$OUT/warm.jsonl" 2>&1
for trial in 1 2; do
  for variant in gpu amp; do
    evict
    python3 benchmarks/step_options.py "$variant:base" --epochs 2 2>&1 | tail -1 \
      | sed 's/^{/{"libs": "evicted", /'
    python3 benchmarks/step_options.py "$variant:base" --epochs 2 2>&1 | tail -1 \
      | sed 's/^{/{"libs": "cached", /'
  done
done | tee "$OUT/runs.jsonl"
# What one small bf16 and fp32 convolution (forward and backward) and matmul make a process
# map, and how long they take with the libraries evicted, then cached.
probe='
import os, time, torch
t0 = time.perf_counter(); torch.empty(1, device="cuda"); torch.cuda.synchronize(); t1 = time.perf_counter()
for dtype in (torch.float32, torch.bfloat16):
    x = torch.randn(8, 1, 28, 28, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(32, 1, 3, 3, device="cuda", dtype=dtype, requires_grad=True)
    torch.nn.functional.conv2d(x, w).sum().backward()
    (x.flatten(1) @ torch.randn(784, 10, device="cuda", dtype=dtype)).sum().backward()
torch.cuda.synchronize(); t2 = time.perf_counter()
maps = {l.split()[-1] for l in open("/proc/self/maps") if ".so" in l}
mb = sum(os.path.getsize(p) for p in maps if os.path.exists(p)) / 2**20
big = sorted(((os.path.getsize(p) >> 20, os.path.basename(p)) for p in maps if os.path.exists(p)), reverse=True)[:12]
print(f"context {t1 - t0:.2f} s, first conv+matmul {t2 - t1:.2f} s, {len(maps)} libraries mapped, {mb:.0f} MiB:", big)
import pynvml  # what a read of the energy counter costs (a train stage reads it every epoch)
pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0); reads = []
for _ in range(50):
    t = time.perf_counter(); pynvml.nvmlDeviceGetTotalEnergyConsumption(h); reads.append(time.perf_counter() - t)
reads.sort(); print(f"NVML energy read: median {reads[25] * 1e3:.2f} ms, max {reads[-1] * 1e3:.2f} ms")'
{ evict; echo -n "evicted: "; python3 -c "$probe"; echo -n "cached: "; python3 -c "$probe"; } 2>&1 \
  | tee "$OUT/probe.txt"
