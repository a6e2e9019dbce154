#!/usr/bin/env python3
"""Corpus scans on several GPUs (issue 47): diffscope-scan on one GPU against diffscope-scan --backend cuda:all (or a
given list) in the same run, on the same corpus of random-id prompts (a random model of kajuma's shape, no tokenizer
needed), alternating rounds. Prompts/s is prompts over the report's elapsed_s (the scan's wall time after the models
are loaded). The reports must be identical but for the timings: the per-prompt numbers of N GPUs are one GPU's. The
timed rounds run with the GEMM autotuning on (the default; each GPU times its own candidates, so two GPUs may pick
different algorithms for a shape); the identity check runs once more with DS_GEMM_AUTOTUNE=0, the heuristic's
deterministic choice, as the issue asks ("pin the GEMM algorithm choice").

    bench/scan_gpus.py --scan build/diffscope-scan --model DIR [--lengths 4096,16384] [--prompts 64]
                       [--multi cuda:all] [--rounds 2] [--in-order-too] [--json OUT.json]

--in-order-too also times the multi runs with DS_SCAN_IN_ORDER=1 (the replicas' length-bucket queue off).
"""
import argparse
import copy
import json
import os
import random
import subprocess
import sys
import tempfile


def timeless(r):
    r = copy.deepcopy(r)
    r.pop("elapsed_s")
    r.pop("backend", None)
    for p in r["per_prompt"]:
        p.pop("ms")
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scan", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--lengths", default="4096,16384")
    ap.add_argument("--prompts", type=int, default=128, help="prompts per length")
    ap.add_argument("--vocab", type=int, default=8192, help="ids drawn below this")
    ap.add_argument("--single", default="cuda:0")
    ap.add_argument("--multi", default="cuda:all")
    ap.add_argument("--multi-args", default="", help="more diffscope-scan flags for the multi runs (--gpu-mem-limit 40G:"
                    " a layer split group per replica)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--in-order-too", action="store_true", help="also time the multi runs with DS_SCAN_IN_ORDER=1 "
                    "(prompts strictly in input order: the A/B of the replicas' length-bucket queue)")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="scan_gpus_")
    rng = random.Random(47)
    out = {"model": a.model, "single": a.single, "multi": a.multi, "rows": []}
    for n in [int(x) for x in a.lengths.split(",")]:
        corpus = os.path.join(work, f"c{n}.jsonl")
        with open(corpus, "w") as f:
            for i in range(a.prompts):
                # Mixed lengths around n (long and short prompts mix), the answer span at a random depth.
                m = rng.randint(n // 2, n)
                b = rng.randint(1, m - 9)
                f.write(json.dumps({"ids": [rng.randrange(a.vocab) for _ in range(m)], "answer": [b, b + 8]}) + "\n")
        variants = ["single", "multi"] + (["in_order"] if a.in_order_too else [])
        rates = {v: [] for v in variants}
        reports = {}
        for rnd in range(a.rounds):
            for which in variants if rnd % 2 == 0 else variants[::-1]:
                rep = os.path.join(work, f"{which}{n}.json")
                backend = a.single if which == "single" else a.multi
                extra = a.multi_args.split() if which != "single" else []
                env = dict(os.environ, DS_SCAN_IN_ORDER="1" if which == "in_order" else "0")
                p = subprocess.run([a.scan, "--backend", backend, "--model", a.model, "--input", corpus,
                                    "--out", rep, "--no-progress"] + extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=env)
                if rnd == 0 and which == "multi":
                    print("   ", p.stderr.splitlines()[0] if p.stderr else "", flush=True)
                if p.returncode != 0:
                    sys.exit(f"{which} scan failed ({p.returncode}): {p.stderr[-2000:]}")
                r = json.load(open(rep))
                rates[which].append(r["prompts"] / r["elapsed_s"])
                reports[which] = r
                print(f"{n:>6} tokens  {which:8} {backend:10} {r['prompts']} prompts in {r['elapsed_s']:.2f} s: "
                      f"{rates[which][-1]:.2f} prompts/s", flush=True)
        pinned = {}
        for which in ("single", "multi"):
            rep = os.path.join(work, f"pinned_{which}{n}.json")
            extra = a.multi_args.split() if which == "multi" else []
            p = subprocess.run([a.scan, "--backend", getattr(a, which), "--model", a.model, "--input", corpus, "--out", rep,
                                "--no-progress"] + extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, DS_GEMM_AUTOTUNE="0"))
            if p.returncode != 0:
                sys.exit(f"pinned {which} scan failed ({p.returncode}): {p.stderr[-2000:]}")
            pinned[which] = json.load(open(rep))
        same = timeless(pinned["single"]) == timeless(pinned["multi"])
        same_tuned = timeless(reports["single"]) == timeless(reports["multi"])
        s, m = max(rates["single"]), max(rates["multi"])
        row = {"tokens_max": n, "prompts": a.prompts, "single_prompts_per_s": s, "multi_prompts_per_s": m,
               "speedup": m / s, "reports_identical": same, "reports_identical_tuned": same_tuned, "rounds": a.rounds,
               "single_all": rates["single"], "multi_all": rates["multi"]}
        if a.in_order_too:
            o = max(rates["in_order"])
            row.update({"in_order_prompts_per_s": o, "in_order_speedup": o / s, "in_order_all": rates["in_order"],
                        "reports_identical_in_order": timeless(reports["in_order"]) == timeless(reports["single"])})
            print(f"{n:>6} tokens: {a.multi} in input order (DS_SCAN_IN_ORDER=1) {o:.2f} prompts/s: {o / s:.2f}x",
                  flush=True)
        print(f"{n:>6} tokens: {a.multi} {m:.2f} prompts/s vs {a.single} {s:.2f}: {m / s:.2f}x; reports identical "
              f"but timings: {same} (GEMM choice pinned), {same_tuned} (each GPU tuning its own)", flush=True)
        out["rows"].append(row)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    if not all(r["reports_identical"] for r in out["rows"]):
        sys.exit("the multi-GPU report differs from the one-GPU report")


if __name__ == "__main__":
    main()
