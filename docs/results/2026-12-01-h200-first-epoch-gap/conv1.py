import sys, time, torch
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = True
conv = torch.nn.Conv2d(32, 64, 3).cuda().to(memory_format=torch.channels_last)
x = torch.randn(512, 32, 26, 26, device="cuda").to(memory_format=torch.channels_last).requires_grad_()
torch.cuda.synchronize()
for i in range(2):
    t = time.perf_counter(); y = conv(x); torch.cuda.synchronize(); f = time.perf_counter() - t
    t = time.perf_counter(); y.sum().backward(); torch.cuda.synchronize(); b = time.perf_counter() - t
    print(f"{sys.argv[1]} call {i}: forward {f:.3f} s backward {b:.3f} s", flush=True)
