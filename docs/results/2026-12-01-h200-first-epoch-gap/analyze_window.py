"""Usage: python3 analyze_window.py RUN_FOLDER LABEL...: the main thread's stacks in the first 7 s
of `_train_epoch`, from sampler.py's samples (10 ms)."""
import gzip, json, sys, collections
def load(label):
    s = json.load(gzip.open(f"{sys.argv[1]}/{label}.samples.json.gz", "rt"))
    main = [x for x in s if x[1] == "MainThread"]
    ep = [x[0] for x in main if any(":_train_epoch" in f for f in x[2])]
    return s, ep[0], ep[-1]
for label in sys.argv[2:]:
    s, a, b = load(label)
    print(f"=== {label}: _train_epoch from {a:.2f} to {b:.2f} s")
    # first epoch: until first 'record' call of epoch totals... approximate: first 6 s
    win = [x for x in s if a <= x[0] <= a + 7.0]
    by = collections.Counter()
    for t, name, st in win:
        if name == "MainThread":
            key = " < ".join(f.split(":")[0].split("/")[-1] + ":" + f.split(":")[2] for f in st[:7])
            by[key] += 1
    for k, v in by.most_common(14):
        print(f"{v*0.0105:6.2f}s  {k[:260]}")
    names = collections.Counter(n for _, n, _ in win)
    print("threads:", dict(names))
