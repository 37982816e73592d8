"""Run `accelbench ARGS` with a wall-clock stack sampler over every thread (10 ms), and dump
torch.compile's own timings and counters at exit. SAMPLE_OUT names the output prefix."""
import atexit, gzip, json, os, sys, threading, time

OUT = os.environ["SAMPLE_OUT"]
T0 = time.perf_counter()
samples = []
stop = threading.Event()

def stack(frame):
    out = []
    while frame is not None and len(out) < 40:
        c = frame.f_code
        out.append(f"{c.co_filename.split('site-packages/')[-1]}:{frame.f_lineno}:{c.co_name}")
        frame = frame.f_back
    return out

def loop():
    me = threading.get_ident()
    while not stop.is_set():
        now = time.perf_counter() - T0
        names = {t.ident: t.name for t in threading.enumerate()}
        for tid, frame in sys._current_frames().items():
            if tid != me:
                samples.append((round(now, 3), names.get(tid, str(tid)), stack(frame)))
        time.sleep(0.01)

def dump():
    stop.set()
    with gzip.open(OUT + ".samples.json.gz", "wt") as f:
        json.dump(samples, f)
    try:
        import torch._dynamo.utils as u
        with open(OUT + ".compile.txt", "w") as f:
            f.write(u.compile_times(repr="str", aggregate=True) + "\n")
            f.write(json.dumps({k: dict(v) for k, v in u.counters.items()}, indent=1, default=str))
    except Exception as exc:
        print("dump failed", exc, file=sys.stderr)

atexit.register(dump)
threading.Thread(target=loop, daemon=True, name="sampler").start()
sys.argv = ["accelbench", *sys.argv[1:]]
from accelbench.cli import main
raise SystemExit(main())
