#!/usr/bin/env python3
"""diffscope-scan as a user runs it: exit codes and one-line messages for bad arguments and files, a scan with a bad
line (skipped, numbered, not fatal) comparing the demo DiffLlama with its twin, the CSV and PNG it writes, and Ctrl-C
leaving a valid partial report.

    scan_cli_check.py SCAN_BINARY DEMO_DIFF DEMO_LLAMA WORKDIR
"""
import json
import os
import signal
import struct
import subprocess
import sys
import time

scan, diff_dir, llama_dir, work = sys.argv[1:5]
os.makedirs(work, exist_ok=True)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(args, code, needle):
    p = subprocess.run([scan] + args, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    check(p.returncode == code, f"{args}: exit {p.returncode}, expected {code}\n{out}")
    check(needle in out, f"{args}: output lacks {needle!r}:\n{out}")
    return p


# Bad arguments: exit 2.
corpus = os.path.join(work, "corpus.jsonl")
report = os.path.join(work, "report.json")
run(["--input", corpus, "--out", report], 2, "--model DIR is required")
run(["--model", diff_dir, "--out", report], 2, "--input PROMPTS.jsonl is required")
run(["--model", diff_dir, "--input", corpus], 2, "--out REPORT.json is required")
run(["--model", diff_dir, "--input", corpus, "--out", report, "--frobnicate", "1"], 2, "unknown option --frobnicate")
run(["--model", diff_dir, "--input", corpus, "--out", report, "--backend", "tpu"], 2, "unknown backend")
run(["--model", diff_dir, "--input", corpus, "--out", report, "--lambda-scale", "x"], 2, "is not a number")
run(["--model", diff_dir, "--input", corpus, "--out", report, "--compare-label", "x"], 2, "--compare-label needs")
run(["--help"], 0, "usage: diffscope-scan")

# Unusable files: exit 3, naming the file.
run(["--model", diff_dir, "--input", corpus + ".missing", "--out", report, "--backend", "cpu"], 3,
    corpus + ".missing: cannot open")
run(["--model", "/nonexistent/model", "--input", __file__, "--out", report, "--backend", "cpu"], 3,
    "/nonexistent/model")

# A corpus: text prompts with character spans and targets, an ids prompt, a bad line and a span outside its prompt.
needle_text = "The secret word of the blue door is otter."
filler = " The grass is green. The sky is blue. Rain falls softly on the roof." * 6
lines = []
for i, depth in enumerate([0.0, 0.5, 1.0, 0.5]):
    cut = int(len(filler) * depth)
    text = filler[:cut] + " " + needle_text + filler[cut:] + " Question: what is the secret word of the blue door? Answer:"
    at = text.index("otter")
    lines.append(json.dumps({"text": text, "answer": [at, at + 5], "target": " otter", "depth": depth, "length": 200}))
lines.insert(2, "this line is not JSON")
lines.append(json.dumps({"ids": [0, 5, 6, 7, 8, 9], "answer": [2, 4]}))
lines.append(json.dumps({"ids": [0, 5, 6], "answer": [2, 9]}))
with open(corpus, "w") as f:
    f.write("\n".join(lines) + "\n")
csv, png = os.path.join(work, "report.csv"), os.path.join(work, "report.png")
# Outputs that would destroy the corpus or a device are refused before any work, and the corpus stays whole.
with open(corpus) as f:
    before = f.read()
run(["--model", diff_dir, "--input", corpus, "--out", corpus, "--backend", "cpu"], 3, "is the input")
run(["--model", diff_dir, "--input", corpus, "--out", report, "--csv", "/dev/null", "--backend", "cpu"], 3,
    "/dev/null: is not a regular file")
run(["--model", diff_dir, "--input", corpus, "--out", report, "--csv", report, "--backend", "cpu"], 3,
    "named for both")
with open(corpus) as f:
    check(f.read() == before, "the corpus changed")
# Every line skipped: an error (exit 3) and a report that is not complete.
bad_corpus = os.path.join(work, "all_bad.jsonl")
with open(bad_corpus, "w") as f:
    f.write("not json\n{\"ids\": [1, 2]}\n")
run(["--model", diff_dir, "--input", bad_corpus, "--out", os.path.join(work, "bad.json"), "--backend", "cpu"], 3,
    "no prompt could be scanned")
with open(os.path.join(work, "bad.json")) as f:
    check(json.load(f)["complete"] is False, "a scan of nothing says complete")
p = run(["--model", diff_dir, "--compare-model", llama_dir, "--input", corpus, "--out", report, "--csv", csv,
         "--plot", png, "--backend", "cpu", "--threads", "2"], 0, "line 3 skipped: not valid JSON")
check("line 7 skipped" in p.stderr and "outside the prompt's 3 tokens" in p.stderr, "the bad span is reported:\n" + p.stderr)
r = json.load(open(report))
check(r["complete"] is True, "complete report")
check(r["prompts"] == 5 and r["compare"]["prompts"] == 5, f"5 prompts in both runs: {r['prompts']}")
check([s["line"] for s in r["skipped"]] == [3, 7], f"skipped lines: {r['skipped']}")
check(r["with_target"] == 4 and r["accuracy"] is not None, "accuracy over the 4 targets")
check(r["differential"] is True and r["compare"]["differential"] is False, "a differential and a plain run")
check("answer_diff" in r["mean"] and "answer_diff" not in r["compare"]["mean"], "plain runs have one map")
check([g["value"] for g in r["groups"]["depth"]] == [0.0, 0.5, 1.0], f"depth groups: {r['groups'].get('depth')}")
for run_ in (r, r["compare"]):
    m = run_["mean"]
    check(abs(m["answer1"] + m["sink1"] + m["context1"] - 1) < 1e-6, "A1 fractions sum to 1")
rows = open(csv).read().splitlines()
nheads = sum(len(l["heads"]) for l in r["layers"]) + sum(len(l["heads"]) for l in r["compare"]["layers"])
check(len(rows) == 1 + nheads and rows[0].startswith("label,layer,head,answer1"), f"CSV rows: {len(rows)}")
with open(png, "rb") as f:
    head = f.read(24)
check(head[:8] == b"\x89PNG\r\n\x1a\n", "PNG signature")
w, h = struct.unpack(">II", head[16:24])
check(w >= 800 and h >= 400, f"PNG size {w}x{h}")
# A blank page of that size is ~4 KB; the plot's panels, text and heatmaps make far more.
check(os.path.getsize(png) > 20000, f"PNG of {os.path.getsize(png)} bytes: blank?")
run(["--model", diff_dir, "--input", corpus, "--out", report, "--backend", "cpu", "--plot",
     "/nonexistent/dir/x.png"], 3, "x.png: cannot write the plot")

# Ctrl-C: a long corpus, interrupted once the report shows a finished prompt: exit 130, a valid partial report.
long_corpus = os.path.join(work, "long.jsonl")
with open(long_corpus, "w") as f:
    for i in range(3000):
        f.write(lines[i % 2] + "\n")
partial = os.path.join(work, "partial.json")
proc = subprocess.Popen([scan, "--model", diff_dir, "--input", long_corpus, "--out", partial, "--backend", "cpu",
                         "--threads", "1", "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
deadline = time.time() + 120
seen = 0
while time.time() < deadline and proc.poll() is None:
    time.sleep(0.5)
    try:
        seen = json.load(open(partial))["prompts"]
    except (OSError, ValueError, KeyError):
        continue  # not written yet
    if seen >= 1:
        break
proc.send_signal(signal.SIGINT)
out, err = proc.communicate(timeout=120)
check(proc.returncode == 130, f"interrupted scan exits 130, got {proc.returncode}\n{err}")
check("interrupted after" in err, "says it was interrupted:\n" + err)
pr = json.load(open(partial))
check(pr["complete"] is False and 1 <= pr["prompts"] < 3000, f"partial report: complete {pr['complete']}, {pr['prompts']} prompts")
check(len(pr["per_prompt"]) == pr["prompts"], "per-prompt entries match the count")
check(not os.path.exists(partial + ".partial"), "no temporary file left")

if failures:
    sys.exit(f"{len(failures)} check(s) failed")
print("scan CLI: all checks passed")
