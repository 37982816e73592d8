# Does the driver read CUDA_CACHE_PATH's files when CUDA starts, or at the first JIT? CUDA
# starts with an empty folder, then a warm cache is copied in, then the conv runs.
import os, shutil, sys, time, torch
torch.backends.cudnn.benchmark = True
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
shutil.copytree(sys.argv[1], os.environ["CUDA_CACHE_PATH"], dirs_exist_ok=True)
conv = torch.nn.Conv2d(32, 64, 3).cuda().to(memory_format=torch.channels_last)
x = torch.randn(512, 32, 26, 26, device="cuda").to(memory_format=torch.channels_last).requires_grad_()
t = time.perf_counter(); y = conv(x); torch.cuda.synchronize(); f = time.perf_counter() - t
t = time.perf_counter(); y.sum().backward(); torch.cuda.synchronize(); b = time.perf_counter() - t
print(f"lazy: cache copied in after CUDA started: forward {f:.3f} s backward {b:.3f} s", flush=True)
