#!/usr/bin/env python3
"""diffscope-run --outliers and Ctrl-C: the attention logits' passes stop between layers, nothing is written, the exit
code is 130. Waits for the statistics to have started (the line diffscope-run says on stderr), never for a clock.
usage: run_outliers_sigint_check.py DIFFSCOPE_RUN MODEL_DIR WORK_DIR"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sigint_when import sigint_when  # noqa: E402

run, model, work = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(work, exist_ok=True)
ids = os.path.join(work, "ids.txt")
out = os.path.join(work, "outliers.json")
if os.path.exists(out):
    os.remove(out)
with open(ids, "w") as f:  # 4000 tokens: seconds of attention logits on a CPU
    f.write(" ".join(str(10 + (100 + i) % 4000) for i in range(4000)))
p = subprocess.Popen([run, "--model", model, "--token-ids-file", ids, "--backend", "cpu", "--threads", "2",
                      "--outliers", out], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
seen = sigint_when(p, p.stderr, lambda s: b"the activation outliers" in s, lambda f: f.readline())
_, err = p.communicate(timeout=600)  # a guard against a hang only
err = (seen + err).decode(errors="replace")
fails = []
if p.returncode != 130:
    fails.append("exit %d, expected 130:\n%s" % (p.returncode, err[-2000:]))
if "the outlier statistics were not written" not in err:
    fails.append("does not say the statistics were not written:\n" + err[-2000:])
if os.path.exists(out):
    fails.append("wrote " + out)
for f in fails:
    print("FAIL:", f)
print("%d passed, %d failed" % (3 - len(fails), len(fails)))
sys.exit(1 if fails else 0)
