#!/usr/bin/env python3
"""diffscope-run --generate and Ctrl-C: the continuation so far is kept and reported, the exit code is 130.
Waits for the generation to have started (its first streamed token), never for a clock.
usage: run_sigint_check.py DIFFSCOPE_RUN MODEL_DIR"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sigint_when import sigint_when  # noqa: E402

run, model = sys.argv[1], sys.argv[2]
p = subprocess.Popen([run, "--model", model, "--prompt", "The magic word is", "--generate", "100000", "--ignore-eos",
                      "--backend", "cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
# The first bytes after "generated: " mean a token has been streamed: generation runs.
seen = sigint_when(p, p.stdout, lambda s: b"generated: " in s and len(s.split(b"generated: ", 1)[1]) >= 1,
                   lambda f: f.read(1))
out, err = p.communicate(timeout=600)  # a guard against a hang only
out = (seen + out).decode(errors="replace")
fails = []
if p.returncode != 130:
    fails.append("exit %d, expected 130" % p.returncode)
if "stop: stopped" not in out:
    fails.append("no stop line:\n" + out[-2000:])
if "tokens in" not in out:
    fails.append("no count of generated tokens")
for f in fails:
    print("FAIL:", f)
print("%d passed, %d failed" % (3 - len(fails), len(fails)))
sys.exit(1 if fails else 0)
