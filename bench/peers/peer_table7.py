"""Table 7 of the Differential Transformer paper in transformers: a 3B DIFF model against its Transformer twin.

Forward throughput of DiffLlamaForCausalLM (24 query heads of 128 = 12 differential heads) and LlamaForCausalLM (24
heads of 128), random init, bf16, sdpa, next-token logits (logits_to_keep=1), at 2K x 8 and 4K x 4 tokens. The peer of
diffscope-bench --backend cuda --only table7: same shapes, same JSON keys under "table7", the same warm-up (at least
--warmup-ms of runs, then the median of --repeat runs timed with CUDA events).

Paper (Ye et al. 2024, https://arxiv.org/abs/2410.05258, appendix A, Table 7, p. 15): 3B models, 12 DIFF heads vs
24 Transformer heads, d = 128, H100-80GB. Table 7's text gives no depth, MLP width, vocabulary or batch: 28 layers,
MLP 8192 and vocab 100288 are assumed (ASSUMED, as in diffscope-bench). One model is on the GPU at a time (3.8 B
parameters are 7.6 GB in bf16). Writes $OUT/peer_table7.json (OUT defaults to /tmp)."""
import argparse, gc, json, os, time
import torch
import transformers
from transformers import DiffLlamaConfig, DiffLlamaForCausalLM, LlamaConfig, LlamaForCausalLM

SOURCE = ("Differential Transformer (Ye et al. 2024, https://arxiv.org/abs/2410.05258), appendix A, Table 7, p. 15: "
          "3B models, DIFF 12 heads vs Transformer 24 heads, head dim 128, forward tokens/s on an H100-80GB")
ASSUMED = ("not stated with Table 7, so assumed: 28 layers, MLP 8192, vocab 100288, untied lm_head, kv heads = heads "
           "(MHA), batch 8 x 2K and 4 x 4K tokens; rope theta 10000, rms eps 1e-5")
SHAPE = dict(hidden_size=3072, num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=24, head_dim=128,
             intermediate_size=8192, vocab_size=100288, tie_word_embeddings=False, max_position_embeddings=4096,
             rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
# (n, batch, paper DIFF tokens/s, paper Transformer tokens/s)
ROWS = [(2048, 8, 46811, 51228), (4096, 4, 44521, 48762)]
MODELS = {"diff": (DiffLlamaConfig, DiffLlamaForCausalLM), "transformer": (LlamaConfig, LlamaForCausalLM)}


def bench(fn, iters, warm_ms, warm=3):
    # at least `warm` runs and warm_ms of them: the steady state, as diffscope-bench times its own runs
    t0 = time.perf_counter(); k = 0
    while k < warm or time.perf_counter() - t0 < warm_ms / 1e3:
        fn(); k += 1
        if k % 4 == 0: torch.cuda.synchronize()
    torch.cuda.synchronize(); ts = []
    for _ in range(iters):
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    ts.sort(); return ts[len(ts) // 2]


def build(kind, dev="cuda", shape=SHAPE):
    cfg_cls, model_cls = MODELS[kind]
    cfg = cfg_cls(**shape)
    with torch.device(dev):  # initialised where it runs: no 7.6 GB trip through host memory
        return model_cls._from_config(cfg, attn_implementation="sdpa", dtype=torch.bfloat16).eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10, help="timed runs per row; the median is reported (default 10)")
    ap.add_argument("--warmup-ms", type=int, default=int(os.environ.get("DS_BENCH_WARMUP_MS", "1000")),
                    help="run each row for at least this long before timing it (default: $DS_BENCH_WARMUP_MS or 1000)")
    a = ap.parse_args()
    out = os.environ.get("OUT", "/tmp"); dev = "cuda"
    timed, params = {}, {}
    for kind in ("diff", "transformer"):
        m = build(kind, dev)
        params[kind] = sum(p.numel() for p in m.parameters())
        for n, B, *_ in ROWS:
            ids = torch.randint(3, SHAPE["vocab_size"], (B, n), device=dev)
            with torch.no_grad(): ms = bench(lambda: m(ids, logits_to_keep=1), a.repeat, a.warmup_ms)
            timed[(kind, n)] = ms
            print(json.dumps({"model": kind, "n": n, "batch": B, "ms": round(ms, 3), "tok_s": round(B * n / ms * 1e3)}),
                  flush=True)
        del m; gc.collect(); torch.cuda.empty_cache()
    rows = []
    for n, B, pd, pt in ROWS:
        d, t = timed[("diff", n)], timed[("transformer", n)]
        rows.append({"n": n, "batch": B, "diff_ms": round(d, 3), "transformer_ms": round(t, 3),
                     "diff_tok_s": round(B * n / d * 1e3), "transformer_tok_s": round(B * n / t * 1e3),
                     "ratio": round(t / d, 4), "paper_diff_tok_s": pd, "paper_transformer_tok_s": pt,
                     "paper_ratio": round(pd / pt, 4)})
    print(f"\n{'forward, 3B (transformers sdpa)':32} {'n':>6} {'batch':>5} {'ms':>9} {'tokens/s':>9} {'paper':>7}")
    for r in rows:
        print(f"{'Transformer':32} {r['n']:6} {r['batch']:5} {r['transformer_ms']:9.2f} {r['transformer_tok_s']:9} "
              f"{r['paper_transformer_tok_s']:7}")
        print(f"{'DIFF':32} {r['n']:6} {r['batch']:5} {r['diff_ms']:9.2f} {r['diff_tok_s']:9} "
              f"{r['paper_diff_tok_s']:7}")
        print(f"{'DIFF/Transformer':32} {r['n']:6} {r['batch']:5} {'':9} {r['ratio']:9.3f} {r['paper_ratio']:7.3f}")
    config = {"hidden": SHAPE["hidden_size"], "layers": SHAPE["num_hidden_layers"],
              "heads": SHAPE["num_attention_heads"], "kv_heads": SHAPE["num_key_value_heads"],
              "head_dim": SHAPE["head_dim"], "diff_heads": SHAPE["num_attention_heads"] // 2,
              "intermediate": SHAPE["intermediate_size"], "vocab": SHAPE["vocab_size"],
              "tie_embeddings": SHAPE["tie_word_embeddings"]}
    table7 = {"source": SOURCE, "assumed": ASSUMED, "config": config, "diff_params": params["diff"],
              "transformer_params": params["transformer"],
              "weights": "random init (transformers' initializer), bf16, on the GPU",
              "logits": "next-token only (logits_to_keep=1), attn_implementation=sdpa",
              "repeat": a.repeat, "warmup_ms": a.warmup_ms, "rows": rows}
    json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "transformers": transformers.__version__, "table7": table7},
              open(os.path.join(out, "peer_table7.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
