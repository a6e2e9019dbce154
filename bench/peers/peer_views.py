"""The transformers peers of diffscope-bench --only views: long prompts through a map viewer built on transformers.

For n in 1K, 4K, 8K, 32K, 128K tokens (batch 1, random token ids, seed n), on a random-init DiffLlamaForCausalLM of
the kajuma/DiffLlama-0.3B-handcut shape in bf16 on the GPU:
  eager_all_maps_ms  attn_implementation="eager", one forward with output_attentions=True: every layer's maps, what a
                     map viewer built on transformers must do to show any of them (logits_to_keep=1 where supported);
                     eager_peak_gb is torch.cuda.max_memory_allocated over those runs (after a reset), in 1e9 bytes.
  eager_stats_ms     from the maps of that forward, on the GPU in torch: per layer and per returned map (32 of them,
                     see ATTENTIONS), the entropy of each query row, averaged over the n rows. diffscope's head_stats
                     computes these and more (entropy of |D|, first-token mass, negative mass, ... in one pass), so
                     this is a lower bound of the work of diffscope's "stats all layers".
  sdpa_logits_ms     attn_implementation="sdpa", the forward with logits_to_keep=1 and no maps: what transformers
                     takes for the next token alone; sdpa_peak_gb as above.
Out of memory (torch.cuda.OutOfMemoryError or a RuntimeError saying so) is recorded as "<impl>_error": "out of memory";
the memory is freed and the run goes on; eager is not tried at larger n after its first out of memory. Past
--budget-s seconds since the start, the remaining lengths are skipped ("skipped": "time budget").

Timing as diffscope-bench times the views benchmark: a warm-up (at least one run and --warmup-ms of runs), then the
median of 3 runs for n <= 8192 and 2 beyond, each timed with CUDA events, under torch.inference_mode(). One model is
on the GPU at a time (eager first, then sdpa; the same seed, so the same weights; 1.24 B parameters, 2.5 GB in bf16):
transformers 4.4x/4.5x chose the attention class when a layer was built (DIFFLLAMA_ATTENTION_CLASSES), so switching
config._attn_implementation on a built model would not switch it there (5.x dispatches at each forward).

Usage: python3 bench/peers/peer_views.py [OUT.json] [--device cpu --tiny]. OUT.json defaults to $OUT/peer_views.json,
or ./peer_views.json without $OUT. --tiny: 2 layers, hidden 128, 4 heads, 2 kv heads, vocab 512, n in 64 and 128, for
a check of the script on a CPU (times from perf_counter there, no peak memory)."""
import argparse, datetime, gc, inspect, json, os, time
import torch
import transformers
from transformers import DiffLlamaConfig, DiffLlamaForCausalLM

SHAPE_NAME = "kajuma/DiffLlama-0.3B-handcut (random bf16 init)"
ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
SHAPE = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
             num_key_value_heads=8, head_dim=64, tie_word_embeddings=True, max_position_embeddings=131072,
             rms_norm_eps=1e-5, rope_parameters=ROPE)
TINY = dict(SHAPE, vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32)
LENGTHS = [1024, 4096, 8192, 32768, 131072]
TINY_LENGTHS = [64, 128]

# What transformers' DiffLlama returns as attention weights (models/diffllama/modeling_diffllama.py, read in 5.17.0,
# the version on the device, and in the 4.4x/4.5x sources). DiffLlamaAttention.forward in 5.17 makes two calls of the
# attention interface with the same Q (32 query heads of 64) and K (8 key heads, repeat_kv to 32): one with the first
# half of the key heads' V, one with the second half; each call's eager path forms the whole softmax(Q K^T / sqrt(64)
# + causal mask), in float32 cast to bf16, and the first call's maps are returned (the second's, identical, are
# dropped: eager builds every n x n map twice). The outputs are concatenated to 32 heads of 128, chunked on the head
# axis, and out[heads 0-15] - lambda * out[heads 16-31] is taken. (4.4x/4.5x did the same in one call with V doubled to
# 128.) So the returned maps are the softmaxes BEFORE the differential subtraction: returned head h < 16 is A1 of
# differential head h and head h + 16 is its A2 (key head h // 4 and (h + 16) // 4). D = A1 - lambda * A2 is never
# formed: a viewer must build it from the two halves and the layer's lambda (exp(lq1.lk1) - exp(lq2.lk2) +
# lambda_init). Per layer, one [batch, 32, n, n] bf16 tensor; the device run checks it (eager_maps: rows sum to 1,
# minimum 0, which D's rows, summing to 1 - lambda with negative entries, would not).
ATTENTIONS = ("softmax maps of the 32 query heads before the differential subtraction, bf16, [1, 32, n, n] per layer: "
              "heads 0-15 are A1 and heads 16-31 are A2 of the 16 differential heads; D = A1 - lambda*A2 is not returned")


def is_oom(e):
    return isinstance(e, torch.cuda.OutOfMemoryError) or (isinstance(e, RuntimeError) and "out of memory" in str(e))


def free(dev):
    gc.collect()
    if dev == "cuda": torch.cuda.empty_cache()


def sync(dev):
    if dev == "cuda": torch.cuda.synchronize()


def bench(fn, reps, warm_ms, dev, warm=1):
    # at least `warm` runs and warm_ms of them, then the median of `reps` runs timed with CUDA events (perf_counter on a
    # CPU); each run's result is dropped before the next, so a run holds only its own outputs
    t0 = time.perf_counter(); k = 0
    while k < warm or time.perf_counter() - t0 < warm_ms / 1e3:
        fn(); k += 1; sync(dev)
    ts = []
    for _ in range(reps):
        if dev == "cuda":
            s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
            s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
        else:
            t = time.perf_counter(); fn(); ts.append((time.perf_counter() - t) * 1e3)
    ts.sort(); return ts[len(ts) // 2]


def build(impl, dev, shape):
    torch.manual_seed(0)  # the same weights for both implementations
    cfg = DiffLlamaConfig(**shape)
    with torch.device(dev):  # initialised where it runs
        m = DiffLlamaForCausalLM._from_config(cfg, attn_implementation=impl, dtype=torch.bfloat16).eval()
    assert m.config._attn_implementation == impl, (impl, m.config._attn_implementation)
    return m


def keep1_kwargs(m):
    params = inspect.signature(m.forward).parameters
    if "logits_to_keep" in params: return {"logits_to_keep": 1}
    if "num_logits_to_keep" in params: return {"num_logits_to_keep": 1}
    return {}


def entropy_stats(attentions):
    # per layer and returned map: -sum_k A[q,k] log A[q,k] (nats; xlogy gives 0 for the masked zeros), mean over the n
    # query rows q; float32 from the bf16 maps; one [layers, 32] tensor back on the host, as head_stats returns its values
    out = []
    for a in attentions:
        p = a[0].float()
        out.append(-torch.special.xlogy(p, p).sum(-1).mean(-1))
    return torch.stack(out).cpu()


def peak_gb(dev):
    return round(torch.cuda.max_memory_allocated() / 1e9, 2) if dev == "cuda" else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_out = os.path.join(os.environ["OUT"], "peer_views.json") if os.environ.get("OUT") else "peer_views.json"
    ap.add_argument("out", nargs="?", default=default_out, help="JSON path (default: $OUT/peer_views.json)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="2 layers, hidden 128, 4 heads, vocab 512, n in 64 and 128")
    ap.add_argument("--repeat", type=int, default=0, help="timed runs per length (default: 3 to 8K tokens, 2 beyond)")
    ap.add_argument("--warmup-ms", type=int, default=int(os.environ.get("DS_BENCH_WARMUP_MS", "1000")),
                    help="warm-up: at least one run and this long (default: $DS_BENCH_WARMUP_MS or 1000)")
    ap.add_argument("--budget-s", type=float, default=200.0, help="skip the remaining lengths past this (default 200)")
    a = ap.parse_args()
    t_start = time.perf_counter()
    dev = a.device
    shape = TINY if a.tiny else SHAPE
    lengths = TINY_LENGTHS if a.tiny else LENGTHS
    V, L = shape["vocab_size"], shape["num_hidden_layers"]
    reps_of = lambda n: a.repeat if a.repeat > 0 else (3 if n <= 8192 else 2)
    rows = {n: {"n": n} for n in lengths}
    ids_of = lambda n: torch.randint(3, V, (1, n), generator=torch.Generator().manual_seed(n)).to(dev)
    over_budget = lambda: time.perf_counter() - t_start > a.budget_s
    meta = {}

    # 1 and 3: eager, all maps, and statistics from them (the models are built outside inference_mode: their
    # parameters stay ordinary tensors)
    m = build("eager", dev, shape)
    with torch.inference_mode():
        kw = keep1_kwargs(m)
        meta["params"] = sum(p.numel() for p in m.parameters())
        meta["logits_to_keep"] = next(iter(kw.values()), None)
        oom_at = None
        for n in lengths:
            r = rows[n]
            if oom_at is not None:
                r["eager_skipped"] = f"out of memory at {oom_at} tokens"; continue
            if over_budget():
                r["eager_skipped"] = r["skipped"] = "time budget"; continue
            ids = ids_of(n); failed = False
            try:
                if dev == "cuda": torch.cuda.reset_peak_memory_stats()
                ms = bench(lambda: m(ids, output_attentions=True, **kw), reps_of(n), a.warmup_ms, dev)
                r["eager_all_maps_ms"] = round(ms, 3); r["eager_peak_gb"] = peak_gb(dev)
            except Exception as e:
                if not is_oom(e): raise
                failed = True
            if failed:
                r["eager_error"] = "out of memory"; oom_at = n; free(dev)
                print(json.dumps(r), flush=True); continue
            # the maps of one forward, kept, then the statistics from them
            try:
                out = m(ids, output_attentions=True, **kw)
                att = out.attentions
                assert att is not None and len(att) == L, "no attentions returned"
                a0 = att[0]
                r["eager_maps"] = {"layers": len(att), "shape": list(a0.shape), "dtype": str(a0.dtype).replace("torch.", ""),
                                   "layer0_min": float(a0.min()), "layer0_row_sum_mean": float(a0[0].float().sum(-1).mean())}
                ent = None
                ms = bench(lambda: entropy_stats(att), reps_of(n), a.warmup_ms, dev)
                ent = entropy_stats(att)
                H2 = ent.shape[1] // 2
                r["eager_stats_ms"] = round(ms, 3)
                r["eager_stats_mean_entropy_a1"] = round(float(ent[:, :H2].mean()), 4)  # nats, a check (<= log n)
                r["eager_stats_mean_entropy_a2"] = round(float(ent[:, H2:].mean()), 4)
            except Exception as e:
                if not is_oom(e): raise
                failed = True
            out = att = a0 = ent = None
            if failed: r["eager_stats_error"] = "out of memory"
            free(dev)
            print(json.dumps(r), flush=True)
    del m; free(dev)

    # 2: sdpa, next-token logits only
    if not over_budget():
        m = build("sdpa", dev, shape)
        kw = keep1_kwargs(m)
    with torch.inference_mode():
        for n in lengths:
            r = rows[n]
            if over_budget():
                r["sdpa_skipped"] = r["skipped"] = "time budget"; continue
            ids = ids_of(n); failed = False
            try:
                if dev == "cuda": torch.cuda.reset_peak_memory_stats()
                ms = bench(lambda: m(ids, **kw), reps_of(n), a.warmup_ms, dev)
                r["sdpa_logits_ms"] = round(ms, 3); r["sdpa_peak_gb"] = peak_gb(dev)
            except Exception as e:
                if not is_oom(e): raise
                failed = True
            if failed: r["sdpa_error"] = "out of memory"
            free(dev)
            print(json.dumps(r), flush=True)

    rows = [rows[n] for n in lengths]
    fmt = lambda v, f="9.2f": format(v, f) if isinstance(v, (int, float)) else "-".rjust(int(f.split(".")[0]))
    print(f"\n{'n':>7} {'eager all maps ms':>18} {'eager GB':>9} {'entropy ms':>11} {'sdpa keep1 ms':>14} {'sdpa GB':>8}  notes")
    for r in rows:
        notes = "; ".join(f"{k}: {v}" for k, v in r.items() if k.endswith(("_error", "_skipped")))
        print(f"{r['n']:7} {fmt(r.get('eager_all_maps_ms'), '18.2f')} {fmt(r.get('eager_peak_gb'))} "
              f"{fmt(r.get('eager_stats_ms'), '11.2f')} {fmt(r.get('sdpa_logits_ms'), '14.2f')} "
              f"{fmt(r.get('sdpa_peak_gb'), '8.2f')}  {notes}")
    config = {"hidden": shape["hidden_size"], "layers": L, "heads": shape["num_attention_heads"],
              "kv_heads": shape["num_key_value_heads"], "head_dim": shape["head_dim"],
              "intermediate": shape["intermediate_size"], "vocab": V, "tie_embeddings": shape["tie_word_embeddings"],
              "max_position_embeddings": shape["max_position_embeddings"], "rope": ROPE}
    res = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__,
           "transformers": transformers.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "shape": SHAPE_NAME if not a.tiny else "tiny (2 layers, hidden 128, 4 heads, 2 kv heads, vocab 512)",
           "config": config, "params": meta["params"], "logits_to_keep": meta["logits_to_keep"],
           "weights": "random init (transformers' initializer, seed 0), bf16, on the device",
           "tokens": "batch 1, uniform ids in [3, vocab), seed n",
           "attentions_returned": ATTENTIONS,
           "stats": "per layer and returned map: entropy of each query row (nats), mean over the n rows, float32 in "
                    "torch on the device from the bf16 maps; A1 and A2 only (not D)",
           "timing": "warm-up of at least one run and warmup_ms, then the median of repeat runs (CUDA events), "
                     "torch.inference_mode()",
           "repeat": {str(n): reps_of(n) for n in lengths}, "warmup_ms": a.warmup_ms, "budget_s": a.budget_s,
           "elapsed_s": round(time.perf_counter() - t_start, 1), "rows": rows}
    d = os.path.dirname(os.path.abspath(a.out)); os.makedirs(d, exist_ok=True)
    json.dump(res, open(a.out, "w"), indent=1)
    print(f"wrote {a.out} ({res['elapsed_s']} s)")


if __name__ == "__main__":
    main()
