#!/usr/bin/env python3
"""diffscope-scan --shard I/N and --merge, and replicas (--backend cpu,cpu: two CPU backends standing in for two GPUs),
on the demo pair: the shards' reports merged in any order, and a scan whose prompts two replicas share, are the report
of one run over the whole input (JSON except the timings, CSV and plot byte for byte); every way a merge can be wrong
is a one-line error naming the file; Ctrl-C stops every replica and leaves a valid partial report.

usage: scan_shard_check.py DIFFSCOPE_SCAN DIFF_MODEL TWIN_MODEL WORK_DIR"""
import json
import os
import pickle
import shutil
import subprocess
import sys

scan, diff_dir, twin_dir, work = sys.argv[1:5]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(args, code=0):
    p = subprocess.run([scan] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=work)
    check(p.returncode == code, f"{args}: exit {p.returncode}, expected {code}\n{p.stderr}")
    return p


def line(i, depth):
    """A retrieval prompt of the demo's training format: four pass codes, one asked for, its characters the span."""
    facts = [("blue door", "4729"), ("red door", "1185"), ("blue gate", "6032"), ("green box", "3310")]
    key, code = facts[i]
    parts = ["The pass code of the %s is %s." % f for j, f in enumerate(facts) if j != i]
    parts.insert(depth, "The pass code of the %s is %s." % (key, code))
    text = " ".join(parts) + " Question: what is the pass code of the %s? Answer:" % key
    b = text.index(code)
    return {"text": text, "answer": [b, b + len(code)], "target": " " + code, "depth": depth, "length": len(text) // 64}


lines = [json.dumps(line(i % 4, i % 3)) for i in range(10)]
lines.insert(3, '{"text": "a broken line"')
lines.insert(6, json.dumps({"ids": [0, 17, 42, 99, 5, 17, 42, 99, 5], "answer": [2, 4], "depth": "ids"}))
lines.insert(8, json.dumps({"ids": [0, 17, 99999], "answer": [1, 2]}))  # an id outside the vocabulary
corpus = os.path.join(work, "corpus.jsonl")
with open(corpus, "w") as f:
    f.write("\n".join(lines) + "\n")

common = ["--backend", "cpu", "--model", diff_dir, "--compare-model", twin_dir, "--input", "corpus.jsonl", "--outliers",
          "--no-progress"]
run(common + ["--out", "one.json", "--csv", "one.csv", "--plot", "one.png"])
N = 3
for i in range(N):
    run(common + ["--shard", f"{i}/{N}", "--out", f"s{i}.json"])
shard0 = json.load(open(os.path.join(work, "s0.json")))
check({k: shard0["shard"][k] for k in ("index", "count")} == {"index": 0, "count": N} and
      len(shard0["shard"]["input_fingerprint"]) == 16 and len(shard0["model_fingerprint"]) == 16 and "totals" in shard0 and "totals" in shard0["compare"], "shard keys")
check([p["line"] for p in shard0["per_prompt"]] == [l for l in range(1, len(lines) + 1) if (l - 1) % N == 0 and l not in (4, 9)],
      "shard 0 holds lines %s" % [p["line"] for p in shard0["per_prompt"]])
run(["--merge", "s2.json", "s0.json", "s1.json", "--out", "merged.json", "--csv", "merged.csv", "--plot", "merged.png"])


def timeless(r):
    r = dict(r)
    r.pop("elapsed_s")
    for run_ in [r] + ([r["compare"]] if "compare" in r else []):
        for p in run_["per_prompt"]:
            p.pop("ms")
    return r


one, merged = (timeless(json.load(open(os.path.join(work, f)))) for f in ("one.json", "merged.json"))
for k in one:
    check(one[k] == merged.get(k), f"merged report differs from one run's in {k!r}")
check(set(one) == set(merged), f"keys {sorted(set(one) ^ set(merged))}")
check(one["prompts"] == 11 and [e["line"] for e in one["skipped"]] == [4, 9] and one["complete"], "one run: %s prompts, skipped %s" % (one["prompts"], one["skipped"]))
check("outliers" in one and "groups" in one and one["groups"].get("depth"), "the report has outliers and groups")
for ext in ("csv", "png"):
    a, b = (open(os.path.join(work, f"{n}.{ext}"), "rb").read() for n in ("one", "merged"))
    check(a == b, f"merged .{ext} differs from one run's")

# Shards are matched by what they scanned: shard 1 of the same corpus and models named another way (absolute paths,
# another spelling of the folders, as on another machine) merges into the same report; shard 1 of another file of
# the same name (run from another folder) is refused.
spelled = ["--backend", "cpu", "--model", os.path.relpath(diff_dir, work), "--compare-model", os.path.relpath(twin_dir, work),
           "--input", corpus, "--outliers", "--no-progress"]
run(spelled + ["--shard", f"1/{N}", "--out", "s1_spelled.json"])
run(["--merge", "s0.json", "s1_spelled.json", "s2.json", "--out", "merged2.json"])
merged2 = timeless(json.load(open(os.path.join(work, "merged2.json"))))
for k in one:
    if k != "input":
        check(one[k] == merged2.get(k) or k == "model" or k == "compare" and
              {a: b for a, b in one[k].items() if a != "model"} == {a: b for a, b in merged2[k].items() if a != "model"},
              f"a shard named another way: the merged report differs in {k!r}")
alt = os.path.join(work, "alt")
os.makedirs(alt, exist_ok=True)
with open(os.path.join(alt, "corpus.jsonl"), "w") as f:
    f.write("\n".join(lines[:-1] + [json.dumps(line(3, 0))]) + "\n")  # one line differs
p = subprocess.run([scan] + common + ["--shard", f"1/{N}", "--out", os.path.join(work, "s1_alt.json")],
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=alt)
check(p.returncode == 0, f"the shard of the other corpus: {p.stderr}")

# Wrong merges: one-line errors naming the file, exit 3 (bad arguments: 2).
run(common + ["--lambda-scale", "0.5", "--shard", f"1/{N}", "--out", "other.json"])
with open(os.path.join(work, "pickle.json"), "wb") as f:
    pickle.dump({"a": 1}, f)
with open(os.path.join(work, "cut.json"), "w") as f:
    f.write(open(os.path.join(work, "s1.json")).read()[:-200])
# Tampered shards: a line of another slice, a line twice, more right answers than targets.
s1 = json.load(open(os.path.join(work, "s1.json")))
def tampered(name, edit):
    j = json.loads(json.dumps(s1))
    edit(j)
    json.dump(j, open(os.path.join(work, name), "w"))
tampered("t_slice.json", lambda j: j["per_prompt"][0].update(line=j["per_prompt"][0]["line"] + 1))
tampered("t_twice.json", lambda j: j["per_prompt"][1].update(line=j["per_prompt"][0]["line"]))
tampered("t_correct.json", lambda j: j["totals"].update(correct=j["totals"]["with_target"] + 1))
cases = [(["s0.json", "s1_alt.json", "s2.json"], "whose content differs"),
         (["s0.json", "t_slice.json", "s2.json"], "is not in the slice of shard 1/3"),
         (["s0.json", "t_twice.json", "s2.json"], "listed twice"),
         (["s0.json", "t_correct.json", "s2.json"], "not a shard's report"),
         (["s0.json", "s2.json"], "shard 1 of 3 missing"), (["s0.json", "s1.json", "s1.json", "s2.json"], "also"),
         (["s0.json", "other.json", "s2.json"], "other.json"), (["one.json"], "one.json"), (["pickle.json"], "pickle.json"),
         (["cut.json", "s0.json", "s2.json"], "cut.json"), (["nowhere.json"], "nowhere.json")]
for files, needle in cases:
    p = run(["--merge"] + files + ["--out", "x.json"], 3)
    err = p.stderr.strip()
    check(needle in err and len(err.splitlines()) == 1, f"--merge {files}: {err!r}")
check(not os.path.exists(os.path.join(work, "x.json")), "a failed merge wrote a report")
p = run(["--merge", "s0.json", "s1.json", "s2.json", "--out", "s1.json"], 3)
check("s1.json" in p.stderr, "the merge refuses to overwrite a shard: %r" % p.stderr)
p = run(["--merge", "s0.json", "s1.json", "s2.json", "--out", "m.json", "--csv", "m.json"], 3)
check("named for both" in p.stderr and not os.path.exists(os.path.join(work, "m.json")),
      "the merge refuses one file for two outputs: %r" % p.stderr)
# Nor over a file of the model folder the shards name (a stand-in folder: the shards' "model" edited to it).
fake = os.path.join(work, "fake_model")
os.makedirs(fake, exist_ok=True)
open(os.path.join(fake, "config.json"), "w").write("{}")
for k in range(N):
    j = json.load(open(os.path.join(work, f"s{k}.json")))
    j["model"] = fake
    json.dump(j, open(os.path.join(work, f"f{k}.json"), "w"))
p = run(["--merge"] + [f"f{k}.json" for k in range(N)] + ["--out", os.path.join(fake, "config.json")], 3)
check("is a file of the model folder" in p.stderr and open(os.path.join(fake, "config.json")).read() == "{}",
      "the merge refuses to write over the model's files: %r" % p.stderr)
for bad in (["--merge", "s0.json"], ["--merge", "s0.json", "--model", diff_dir, "--out", "x.json"], ["--merge", "--out", "x.json"],
            common + ["--shard", "3/3", "--out", "x.json"], common + ["--shard", "1", "--out", "x.json"]):
    p = run(bad, 2)
    check(len(p.stderr.strip().splitlines()) == 1, f"{bad}: {p.stderr!r}")

# Replicas: two CPU backends of one thread each share the prompts; the report is one one-thread backend's.
rep_args = ["--backend", "cpu", "--threads", "1", "--model", diff_dir, "--compare-model", twin_dir, "--input", "corpus.jsonl",
            "--outliers", "--no-progress"]
run(rep_args + ["--out", "t1.json", "--csv", "t1.csv", "--plot", "t1.png"])
rep_args[1] = "cpu,cpu"
p = run(rep_args + ["--out", "t2.json", "--csv", "t2.csv", "--plot", "t2.png"])
check("2 replicas" in p.stderr, "the scan says it runs on two replicas: %r" % p.stderr.splitlines()[:1])
t1, t2 = (timeless(json.load(open(os.path.join(work, f)))) for f in ("t1.json", "t2.json"))
for k in t1:
    check(t1[k] == t2.get(k), f"the two-replica report differs from one backend's in {k!r}")
for ext in ("csv", "png"):
    a, b = (open(os.path.join(work, f"t{n}.{ext}"), "rb").read() for n in (1, 2))
    check(a == b, f"two replicas' .{ext} differs from one backend's")
for bad in ("cpu,1", "cpu,,cpu", "cpu,auto", "gpu:0"):
    p = run(["--backend", bad, "--model", diff_dir, "--input", "corpus.jsonl", "--out", "x.json"], 2)
    check(bad in p.stderr and len(p.stderr.strip().splitlines()) == 1, f"--backend {bad}: {p.stderr!r}")

# Ctrl-C with two replicas: both stop, exit 130, the prompts finished so far in a valid partial report.
import signal
import time
with open(os.path.join(work, "long.jsonl"), "w") as f:
    for i in range(2000):
        f.write(lines[i % 3] + "\n")
partial = os.path.join(work, "partial.json")
proc = subprocess.Popen([scan, "--backend", "cpu,cpu", "--threads", "1", "--model", diff_dir, "--input", "long.jsonl",
                         "--out", partial, "--no-progress"], cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
seen = 0
while proc.poll() is None:  # waits for the first finished prompt in the report, however long a loaded machine takes
    time.sleep(0.3)
    try:
        seen = json.load(open(partial))["prompts"]
    except (OSError, ValueError, KeyError):
        continue
    if seen >= 2:
        break
proc.send_signal(signal.SIGINT)
out, err = proc.communicate()
check(proc.returncode == 130, f"interrupted two-replica scan exits 130, got {proc.returncode}\n{err}")
pr = json.load(open(partial))
lines_done = [q["line"] for q in pr["per_prompt"]]
check(pr["complete"] is False and 2 <= pr["prompts"] < 2000 and len(lines_done) == pr["prompts"], f"partial report {pr['prompts']}")
check(lines_done == sorted(lines_done), "the partial report's prompts are in input order")

if failures:
    sys.exit(f"{len(failures)} check(s) failed")
print("scan shards: all checks passed")
