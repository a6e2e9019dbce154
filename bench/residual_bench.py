#!/usr/bin/env python3
"""The residual-stream readers against the forward they read (issue 46's speed goals), in one process:

  lens       Session.lens() of every layer at the last position after the forward (goal: <= 20 ms at 32K tokens)
  quantised  the forward with 8-bit attention logits (Session.set_logit_bits; goal: <= 10 % slower)
  outliers   Session.outliers(logits=False) (every layer's |hidden| over every position and channel) and
             Session.outliers() (plus every causal |attention logit| of both maps, recomputed three times), against
             the forward of the same prompt (goal: <= 5 % of a forward)

The model: --model DIR, or the kajuma/DiffLlama-0.3B-handcut-shaped random checkpoint that
tools/make_random_checkpoint.py writes (16 layers, 16 differential heads, d 64, vocab 128256; made once into --cache).
The prompt: --tokens random ids (seed 7). Medians of --repeat timed calls after a warm-up; JSON with --json.

  PYTHONPATH=build/python python3 bench/residual_bench.py --backend cuda --tokens 4096,32768
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def timed(f, repeat):
    f()  # warm-up
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--cache", default="/tmp/ds_kajuma_random")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--tokens", default="4096,32768")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--logits-max-tokens", type=int, default=8192, help="the logits' outliers above this: skipped")
    ap.add_argument("--json")
    a = ap.parse_args()
    import diffscope as ds
    model = a.model
    if not model:
        model = a.cache
        if not (Path(model) / "config.json").exists():
            subprocess.run([sys.executable, str(ROOT / "tools/make_random_checkpoint.py"), model], check=True,
                           stdout=subprocess.DEVNULL)
    rows = []
    with ds.open(model, backend=a.backend) as s:
        rng = np.random.default_rng(7)
        for n in [int(x) for x in a.tokens.split(",")]:
            ids = rng.integers(0, min(int(s.config["vocab"]), 128000), size=n).tolist()
            s.run(ids)
            flip = [1.0]

            def forward():  # every layer again: a lambda scale change re-runs from layer 0 (the prompt's forward)
                flip[0] = 1.0 if flip[0] != 1.0 else 1.0 + 1e-3
                s.lambda_scale = flip[0]
                s.run()
            fwd = timed(forward, a.repeat)
            lens = timed(lambda: s.lens(top_k=5), a.repeat)
            hid = timed(lambda: s.outliers(logits=False), a.repeat)
            s.set_logit_bits(8)  # the quantisation what-if: the same forward with 8-bit logits
            fwd_q = timed(forward, a.repeat)
            s.set_logit_bits(None)
            s.run()
            r = {"tokens": n, "forward_ms": fwd, "lens_all_layers_ms": lens, "outliers_hidden_ms": hid,
                 "outliers_hidden_vs_forward": hid / fwd, "forward_quantized8_ms": fwd_q,
                 "quantized_vs_forward": fwd_q / fwd}
            if n <= a.logits_max_tokens:
                full = timed(lambda: s.outliers(), a.repeat)
                r.update(outliers_all_ms=full, outliers_all_vs_forward=full / fwd)
            rows.append(r)
            print(json.dumps(r), flush=True)
        dev = s.backend
    out = {"device": dev, "model": model, "date": time.strftime("%Y-%m-%d"), "rows": rows}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
