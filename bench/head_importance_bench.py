#!/usr/bin/env python3
"""Head importance against its transformers peer, in one process on one machine (issue 46's speed goal):

  ours  diffscope's Session.head_importance(): every view head of every layer ablated in turn (its output zeroed
        before o_proj), each ablation re-running only the layers from its own on, log p(target) at the last position;
  peer  transformers' DiffLlamaForCausalLM (sdpa) with a forward pre-hook on the layer's o_proj that zeroes the
        head's input columns, one full forward (logits of the last position) per head.

The model: --model DIR, or on CUDA the kajuma/DiffLlama-0.3B-handcut-shaped random checkpoint that
`diffscope-bench --backend cuda --only api` writes (16 layers x 16 differential heads = 256 heads). The prompt:
--tokens random ids (seed 7). Both sides are warmed up once; ours is timed --repeat times (median), the peer's loop
once (every head), and the two importance maps are compared (bf16 activations on both sides). JSON with --json.

  PYTHONPATH=build/python python3 bench/head_importance_bench.py --backend cuda --bench build/diffscope-bench
"""
import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def synthetic_model(bench: str) -> str:
    out = Path(tempfile.mkdtemp()) / "api.json"
    subprocess.run([bench, "--backend", "cuda", "--only", "api", "--repeat", "1", "--json", str(out)], check=True,
                   stdout=subprocess.DEVNULL, cwd=ROOT)
    return json.loads(out.read_text())["api"]["model_dir"]


def ours(ds, model_dir: str, ids: np.ndarray, backend: str, repeat: int) -> dict:
    with ds.open(model_dir, backend=backend) as s:
        s.run(ids)
        t0 = time.perf_counter()
        # one mode, as the goal counts (the default is every mode the heads have: a2, a1 and head)
        first = s.head_importance(modes="head")  # warm-up (and GEMM plans for the re-run shapes)
        warm_s = time.perf_counter() - t0
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            imp = s.head_importance(target=first["target"], modes="head")
            times.append(time.perf_counter() - t0)
        return {"seconds_median": statistics.median(times), "seconds": times, "first_call_s": warm_s,
                "target": imp["target"], "base_logp": imp["base_logp"], "layers": imp["layers"],
                "delta": imp["modes"]["head"], "backend": s.backend}


def peer(model_dir: str, ids: np.ndarray, target: int, heads_per_layer: int) -> dict:
    try:
        import torch
        from transformers import DiffLlamaForCausalLM
    except ImportError as e:
        return {"skipped": f"transformers / torch not installed ({e})"}
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = DiffLlamaForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16 if dev == "cuda" else torch.float32,
                                                 attn_implementation="sdpa").to(dev).eval()
    x = torch.tensor(ids, dtype=torch.long, device=dev)[None]
    cols = model.config.num_attention_heads * model.config.head_dim // heads_per_layer
    state = {"layer": -1, "head": -1}

    def make_hook(layer):
        def hook(_mod, args):
            if state["layer"] != layer:
                return None
            h = args[0].clone()
            h[..., state["head"] * cols:(state["head"] + 1) * cols] = 0
            return (h,)
        return hook

    handles = [m.self_attn.o_proj.register_forward_pre_hook(make_hook(i)) for i, m in enumerate(model.model.layers)]

    def logp():
        with torch.no_grad():
            out = model(x, use_cache=False, logits_to_keep=1)
        return float(torch.log_softmax(out.logits[0, -1].float(), -1)[target])

    base = logp()  # warm-up too
    L = len(model.model.layers)
    delta = np.full((L, heads_per_layer), np.nan)
    if dev == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for layer in range(L):
        for head in range(heads_per_layer):
            state["layer"], state["head"] = layer, head
            delta[layer, head] = logp() - base
    if dev == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    for h in handles:
        h.remove()
    return {"seconds": secs, "forward_ms": 1e3 * secs / (L * heads_per_layer), "base_logp": base,
            "delta": delta, "transformers": __import__("transformers").__version__, "torch": torch.__version__,
            "dtype": "bfloat16" if dev == "cuda" else "float32", "attn_implementation": "sdpa"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--bench", default=str(ROOT / "build" / "diffscope-bench"))
    ap.add_argument("--model", help="model folder (default: the kajuma-shaped random checkpoint, CUDA)")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    import diffscope as ds
    model_dir = args.model or synthetic_model(args.bench)
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    rng = np.random.default_rng(7)
    ids = rng.integers(3, cfg["vocab_size"], size=args.tokens).astype(np.int32)
    o = ours(ds, model_dir, ids, args.backend, args.repeat)
    heads = cfg["num_attention_heads"] // 2
    p = {"skipped": "--no-peer"} if args.no_peer else peer(model_dir, ids, o["target"], heads)
    n = len(o["layers"]) * heads
    res = {"name": "head_importance_bench", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "model_dir": model_dir, "tokens": args.tokens, "heads": n, "backend": o["backend"],
           "ours_s": o["seconds_median"], "ours_all_s": o["seconds"], "ours_first_call_s": o["first_call_s"],
           "target": o["target"], "base_logp": o["base_logp"]}
    lines = [f"head importance, {n} heads, {args.tokens} tokens, {o['backend']}",
             "", "| | seconds | ms per head | vs ours |", "|---|---:|---:|---:|",
             f"| diffscope (median of {args.repeat}) | {o['seconds_median']:.3f} | {1e3 * o['seconds_median'] / n:.2f} | 1.00x |"]
    if "skipped" not in p:
        d_ours, d_peer = np.asarray(o["delta"]), p["delta"]
        res.update({"peer_s": p["seconds"], "peer_forward_ms": p["forward_ms"], "peer_base_logp": p["base_logp"],
                    "speedup": p["seconds"] / o["seconds_median"], "peer": {k: p[k] for k in
                    ("transformers", "torch", "dtype", "attn_implementation")},
                    "max_abs_delta_diff": float(np.nanmax(np.abs(d_ours - d_peer))),
                    "rank_corr": float(np.corrcoef(d_ours.ravel(), d_peer.ravel())[0, 1])})
        lines.append(f"| transformers {p['transformers']} ({p['dtype']}, sdpa, forward pre-hooks) | {p['seconds']:.3f} | "
                     f"{p['forward_ms']:.2f} | {res['speedup']:.1f}x slower |")
        lines.append(f"\nmaps: max |ours - peer| {res['max_abs_delta_diff']:.3g}, correlation {res['rank_corr']:.4f}; "
                     f"base log p {o['base_logp']:.4f} vs {p['base_logp']:.4f}")
    else:
        lines.append(f"| peer | {p['skipped']} | | |")
        res["peer"] = p
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    if not args.model and Path(model_dir).name == "diffscope-bench-api-kajuma":
        shutil.rmtree(model_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
