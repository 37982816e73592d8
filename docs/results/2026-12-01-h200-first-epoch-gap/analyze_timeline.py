"""Usage: python3 analyze_timeline.py RUN_FOLDER LABEL...: the main thread's stretches of 80 ms
or more in one place, from 0.2 s before `_train_epoch` to 7 s after (sampler.py's samples)."""
import gzip, json, sys
for label in sys.argv[2:]:
    s = json.load(gzip.open(f"{sys.argv[1]}/{label}.samples.json.gz", "rt"))
    main = [x for x in s if x[1] == "MainThread"]
    ep = [x[0] for x in main if any(":_train_epoch" in f for f in x[2])]
    a = ep[0]
    print("===", label, "epoch start", a)
    prev, start = None, None
    for t, name, st in main:
        if t < a - 0.2 or t > a + 7: continue
        key = " < ".join(f.split(":")[0].split("/")[-1] + ":" + f.split(":")[1]+":"+f.split(":")[2] for f in st[:4])
        if key != prev:
            if prev and t - start > 0.08: print(f"{start-a:6.2f} +{t-start:5.2f}  {prev[:230]}")
            prev, start = key, t
