#!/usr/bin/env python3
"""Old binary against new from tools/run_cuda_suite.sh forward_ab: every row of every section's JSON, matched by its
identifying fields, each timing (a key with an "ms" word) as the best of the runs of each binary, and new / old."""
import glob, json, os, sys

out = sys.argv[1]
ID_KEYS = ("name", "label", "model", "kind", "what", "n", "batch", "prompt", "tokens", "grid", "step")

def timing(k):  # "ms", "wall_ms", "ms_per_token", "gpu_ms_per_step" (not "warmup_ms", a setting)
    return "ms" in k.split("_") and k != "warmup_ms"

def rows(x, path=""):
    if isinstance(x, dict):
        if any(timing(k) and isinstance(v, (int, float)) for k, v in x.items()):
            yield path, x
        for k, v in x.items():
            if k != "kernels":
                yield from rows(v, path + "/" + k)
    elif isinstance(x, list):
        for v in x:
            yield from rows(v, path)

best = {}  # (section, path, id, key) -> {who: [values]}
for f in sorted(glob.glob(os.path.join(out, "ab_*_*_*.json"))):
    sec, who, _ = os.path.basename(f)[3:-5].rsplit("_", 2)
    try:
        data = json.load(open(f))
    except Exception as e:
        print(f"{f}: {e}")
        continue
    for path, r in rows(data):
        ident = tuple((k, r[k]) for k in ID_KEYS if k in r and not isinstance(r[k], (dict, list)))
        for k, v in r.items():
            if timing(k) and isinstance(v, (int, float)) and v > 0:
                best.setdefault((sec, path, ident, k), {}).setdefault(who, []).append(v)

res = []
print("| section | row | timing | old (best) | new (best) | new/old |")
print("|---|---|---|---|---|---|")
for (sec, path, ident, k), d in sorted(best.items(), key=lambda kv: str(kv[0])):
    if "prev" not in d or "this" not in d:
        continue
    a, b = min(d["prev"]), min(d["this"])
    res.append({"section": sec, "path": path, "row": dict(ident), "timing": k, "old": d["prev"], "new": d["this"],
                "ratio": b / a})
    label = path + " " + " ".join(f"{x}={y}" for x, y in ident)
    flag = "" if b / a <= 1.02 else " **"
    print(f"| {sec} | {label} | {k} | {a:.4g} | {b:.4g} | {b / a:.3f}{flag} |")
json.dump(res, open(os.path.join(out, "forward_ab.json"), "w"), indent=1)
worse = [r for r in res if r["ratio"] > 1.02]
print(f"\n{len(res)} timings compared, {len(worse)} more than 2% slower (marked **)")
