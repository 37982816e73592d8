import sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
torch.backends.cudnn.benchmark = sys.argv[2] == "bench" if len(sys.argv) > 2 else True
torch.backends.cudnn.allow_tf32 = True
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t2 = time.perf_counter()
conv = torch.nn.Conv2d(32, 64, 3).cuda().to(memory_format=torch.channels_last)
x = torch.randn(512, 32, 26, 26, device="cuda").to(memory_format=torch.channels_last).requires_grad_()
torch.cuda.synchronize()
print(f"{sys.argv[1]} import {t1-t0:.2f} s cuda-init {t2-t1:.2f} s bench={torch.backends.cudnn.benchmark}", flush=True)
for i in range(2):
    t = time.perf_counter(); y = conv(x); torch.cuda.synchronize(); f = time.perf_counter() - t
    t = time.perf_counter(); y.sum().backward(); torch.cuda.synchronize(); b = time.perf_counter() - t
    print(f"{sys.argv[1]} call {i}: forward {f:.3f} s backward {b:.3f} s", flush=True)
