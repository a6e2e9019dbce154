#!/usr/bin/env python3
"""A random DiffLlama checkpoint of kajuma/DiffLlama-0.3B-handcut's shape (1.24 B parameters, bf16), for running the
GUI and the engine at full size where the real weights cannot be fetched (the GPU machine has no network).

    tools/make_random_checkpoint.py OUT_DIR            kajuma's shape: hidden 2048, 16 layers, 32 heads (8 kv), head
                                                       dim 64, intermediate 8192, vocab 128256, llama3 rope; 2.5 GB
    tools/make_random_checkpoint.py OUT_DIR --small    the same layout at 2 layers, hidden 256: ~70 MB, for CPU tests
    tools/make_random_checkpoint.py OUT_DIR --family motif2
                                                       Motif-2-12.7B's shape (grouped differential attention: hidden
                                                       4096, 40 layers, 40 query heads = 8 groups x (4 signal + 1
                                                       noise), 16 kv heads, head dim 128, PolyNorm MLP 16384, vocab
                                                       219520 as Motif-2.6B's; untied; 12.7 B parameters, 25.4 GB)
    tools/make_random_checkpoint.py OUT_DIR --family phi4flash
                                                       microsoft/Phi-4-mini-flash-reasoning's config and tensor names
                                                       (SambaY, docs/models/phi4flash.md; 3.85 B parameters, 7.7 GB)

numpy only (no torch): config.json, model.safetensors written by hand (8-byte little-endian header length, JSON
header, raw bf16 rounded to nearest-even from float32) in chunks, so memory stays at a few hundred MB, and the demo
model's byte-level BPE tokenizer (assets/models/diffllama-demo, 8192 tokens; the engine takes a tokenizer smaller than
the model's vocabulary: ids past it show as '<unknown id N>').

Weights: tensor names as transformers' DiffLlama writes them (model.layers.L.self_attn.{q,k,v,o}_proj.weight,
lambda_{q,k}{1,2}, mlp.{gate,up,down}_proj.weight, input/post_attention_layernorm.weight, model.norm.weight,
model.embed_tokens.weight; tied embeddings, no lm_head; DiffLlama's group norm has no weights). Matrices ~ N(0, 0.02)
(--std), q_proj and k_proj times --qk-scale (default: sqrt(3 / hidden) / std, 1.9 at kajuma's shape, so a score
q.k / sqrt(head_dim) has a standard deviation of about 3 and the attention maps are far from uniform); lambda vectors ~
N(0, 0.1) as transformers initialises them; norms 1. Embedding rows past the tokenizer's vocabulary are scaled by
--unused-vocab-scale (default 0.1), so the next-token list shows tokens the tokenizer can print. Deterministic in --seed
whatever the number of threads.
"""
import argparse
import json
import os
import shutil
import struct
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "assets", "models", "diffllama-demo")
CHUNK = 1 << 22  # elements per generated piece (16 MB of float32)


def kajuma_config(small):
    c = {
        "architectures": ["DiffLlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 0,  # the shipped tokenizer's <|bos|> / <|eos|>
        "eos_token_id": 1,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 8192,
        "lambda_std_dev": 0.1,
        "max_position_embeddings": 131072,
        "model_type": "diffllama",
        "num_attention_heads": 32,
        "num_hidden_layers": 16,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": 128256,
    }
    if small:
        c.update(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=512)
    return c


def phi4flash_config(small):
    c = {"architectures": ["Phi4FlashForCausalLM"], "model_type": "phi4flash", "bos_token_id": 0,
         "eos_token_id": 1, "hidden_act": "silu", "hidden_size": 2560, "intermediate_size": 10240,
         "layer_norm_eps": 1e-05, "max_position_embeddings": 262144, "mb_per_layer": 2, "num_attention_heads": 40,
         "num_hidden_layers": 32, "num_key_value_heads": 20, "sliding_window": 512, "tie_word_embeddings": True,
         "torch_dtype": "bfloat16", "vocab_size": 200064, "lambda_std_dev": 0.1}
    if small:
        c.update(hidden_size=256, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                 intermediate_size=512, sliding_window=64)
    return c


def motif2_config(small):
    """Motif-2-12.7B (docs: ../shared/MODELS.md 3.2; layer count and vocabulary from a third-party port's notes and
    Motif-2.6B, unverified)."""
    c = {"architectures": ["MotifForCausalLM"], "model_type": "motif", "bos_token_id": 0, "eos_token_id": 1,
         "hidden_act": "poly_norm", "hidden_size": 4096, "intermediate_size": 16384, "num_hidden_layers": 40,
         "num_attention_heads": 40, "num_noise_heads": 8, "num_key_value_heads": 16, "head_dim": 128, "k_ratio": 1,
         "rms_norm_eps": 1e-06, "attn_rms_norm_eps": 1e-05, "max_position_embeddings": 65536, "rope_theta": 1e6,
         "rope_scaling": None, "tie_word_embeddings": False, "use_bias": False, "torch_dtype": "bfloat16",
         "vocab_size": 219520, "lambda_std_dev": 0.1}
    if small:
        c.update(hidden_size=256, num_hidden_layers=2, num_attention_heads=10, num_noise_heads=2,
                 num_key_value_heads=4, head_dim=32, intermediate_size=512)
    return c


def motif2_plan(c, a, tok_vocab):
    """Motif's tensors (tests/gen_motif_fixtures.py names them): q_proj rows of every signal and noise head, k/v of the
    kv heads, o_proj over the signal heads' 2d-wide outputs, subln over 2d, PolyNorm's 3 weights and bias."""
    D, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    H, Hkv, d, noise = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["num_noise_heads"]
    plan = [("model.embed_tokens.weight", (V, D), ("normal", a.std, tok_vocab, a.unused_vocab_scale))]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        plan += [(p + "self_attn.q_proj.weight", (H * d, D), ("normal", a.std * a.qk_scale)),
                 (p + "self_attn.k_proj.weight", (Hkv * d, D), ("normal", a.std * a.qk_scale)),
                 (p + "self_attn.v_proj.weight", (Hkv * d, D), ("normal", a.std)),
                 (p + "self_attn.o_proj.weight", (D, 2 * d * (H - noise)), ("normal", a.std))]
        plan += [(p + "self_attn." + n, (d,), ("normal", c["lambda_std_dev"]))
                 for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")]
        plan += [(p + "self_attn.subln.weight", (2 * d,), ("ones",)),
                 (p + "mlp.gate_proj.weight", (I, D), ("normal", a.std)),
                 (p + "mlp.up_proj.weight", (I, D), ("normal", a.std)),
                 (p + "mlp.down_proj.weight", (D, I), ("normal", a.std)),
                 (p + "mlp.act_fn.weight", (3,), ("const", 1.0 / 3)), (p + "mlp.act_fn.bias", (1,), ("const", 0.0)),
                 (p + "input_layernorm.weight", (D,), ("ones",)),
                 (p + "post_attention_layernorm.weight", (D,), ("ones",))]
    plan += [("model.norm.weight", (D,), ("ones",)), ("lm_head.weight", (V, D), ("normal", a.std))]
    return plan


def phi4flash_plan(c, a, tok_vocab):
    """SambaY's tensors (docs/models/phi4flash.md section 7) with the published initialisation's typical values for
    Mamba's per-channel vectors (A_log = log(1..d_state), D = 1, dt bias giving dt ~ 0.02)."""
    D, I, V, L = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    H, Hkv = c["num_attention_heads"], c["num_key_value_heads"]
    d, di, S, K, R, half = D // H, 2 * D, 16, 4, (D + 15) // 16, L // 2
    plan = [("model.embed_tokens.weight", (V, D), ("normal", a.std, tok_vocab, a.unused_vocab_scale))]
    for l in range(L):
        p = f"model.layers.{l}."
        plan += [(p + "input_layernorm.weight", (D,), ("ones",)), (p + "input_layernorm.bias", (D,), ("const", 0.0))]
        if l % 2 == 0 and l <= half:  # Mamba (memory at half)
            m = p + "attn."
            plan += [(m + "in_proj.weight", (2 * di, D), ("normal", a.std)),
                     (m + "conv1d.weight", (di, 1, K), ("normal", 0.3)), (m + "conv1d.bias", (di,), ("const", 0.0)),
                     (m + "x_proj.weight", (R + 2 * S, di), ("normal", a.std)),
                     (m + "dt_proj.weight", (di, R), ("normal", R ** -0.5)), (m + "dt_proj.bias", (di,), ("const", -4.0)),
                     (m + "A_log", (di, S), ("alog", S)), (m + "D", (di,), ("ones",)),
                     (m + "out_proj.weight", (D, di), ("normal", a.std))]
        elif l % 2 == 0:  # gated memory unit
            plan += [(p + "attn.in_proj.weight", (di, D), ("normal", a.std)),
                     (p + "attn.out_proj.weight", (D, di), ("normal", a.std))]
        else:  # differential attention: sliding window, full (half + 1) or cross (q rows only)
            rows = H * d if l >= half + 3 else (H + 2 * Hkv) * d
            ic = p + "attn.inner_cross_attn."
            plan += [(p + "attn.Wqkv.weight", (rows, D), ("normal", a.std * a.qk_scale)),
                     (p + "attn.Wqkv.bias", (rows,), ("const", 0.0)),
                     (p + "attn.out_proj.weight", (D, H * d), ("normal", a.std)),
                     (p + "attn.out_proj.bias", (D,), ("const", 0.0))]
            plan += [(ic + n, (d,), ("normal", c["lambda_std_dev"])) for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")]
            plan += [(ic + "subln.weight", (2 * d,), ("ones",))]
        plan += [(p + "post_attention_layernorm.weight", (D,), ("ones",)),
                 (p + "post_attention_layernorm.bias", (D,), ("const", 0.0)),
                 (p + "mlp.fc1.weight", (2 * I, D), ("normal", a.std)), (p + "mlp.fc2.weight", (D, I), ("normal", a.std))]
    plan += [("model.final_layernorm.weight", (D,), ("ones",)), ("model.final_layernorm.bias", (D,), ("const", 0.0))]
    return plan


def tensor_plan(c, a, tok_vocab):
    """(name, shape, init) in file order; init is ('normal', std[, scaled_rows_from, row_scale]) or ('ones',)."""
    D, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    H, Hkv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    plan = [("model.embed_tokens.weight", (V, D), ("normal", a.std, tok_vocab, a.unused_vocab_scale))]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        plan += [
            (p + "input_layernorm.weight", (D,), ("ones",)),
            (p + "self_attn.q_proj.weight", (H * d, D), ("normal", a.std * a.qk_scale)),
            (p + "self_attn.k_proj.weight", (Hkv * d, D), ("normal", a.std * a.qk_scale)),
            (p + "self_attn.v_proj.weight", (Hkv * d, D), ("normal", a.std)),
            (p + "self_attn.o_proj.weight", (D, H * d), ("normal", a.std)),
            (p + "self_attn.lambda_q1", (d,), ("normal", c["lambda_std_dev"])),
            (p + "self_attn.lambda_k1", (d,), ("normal", c["lambda_std_dev"])),
            (p + "self_attn.lambda_q2", (d,), ("normal", c["lambda_std_dev"])),
            (p + "self_attn.lambda_k2", (d,), ("normal", c["lambda_std_dev"])),
            (p + "post_attention_layernorm.weight", (D,), ("ones",)),
            (p + "mlp.gate_proj.weight", (I, D), ("normal", a.std)),
            (p + "mlp.up_proj.weight", (I, D), ("normal", a.std)),
            (p + "mlp.down_proj.weight", (D, I), ("normal", a.std)),
        ]
    plan.append(("model.norm.weight", (D,), ("ones",)))
    return plan


def to_bf16(x):
    """float32 -> bf16 bits, round to nearest even (no NaNs here)."""
    u = x.view(np.uint32)
    u += np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    return (u >> np.uint32(16)).astype(np.uint16)


def piece(seed, t_index, shape, init, start, count):
    """Elements [start, start + count) of tensor t_index (row-major), as bf16 bits."""
    if init[0] == "ones":
        return np.full(count, 0x3F80, np.uint16)
    if init[0] == "const":
        return to_bf16(np.full(count, init[1], np.float32))
    if init[0] == "alog":  # S4D-real: A_log[c, s] = log(s + 1)
        idx = np.arange(start, start + count) % init[1]
        return to_bf16(np.log(idx + 1.0).astype(np.float32))
    rng = np.random.default_rng([seed, t_index, start // CHUNK])
    x = rng.standard_normal(count, dtype=np.float32)
    x *= np.float32(init[1])
    if len(init) > 2:  # rows from init[2] on (unused vocabulary) scaled by init[3]
        cols = shape[1]
        first = max(init[2] * cols - start, 0)
        if first < count:
            x[first:] *= np.float32(init[3])
    return to_bf16(x)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--small", action="store_true", help="2 layers, hidden 256 (same vocabulary and rope): a CPU test")
    ap.add_argument("--family", choices=["diffllama", "phi4flash", "motif2"], default="diffllama")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--std", type=float, default=0.02)
    ap.add_argument("--qk-scale", type=float, default=0.0, help="q_proj, k_proj std factor (0: sqrt(3 / hidden) / std)")
    ap.add_argument("--unused-vocab-scale", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 1))
    a = ap.parse_args()

    configs = {"diffllama": kajuma_config, "phi4flash": phi4flash_config, "motif2": motif2_config}
    plans = {"diffllama": tensor_plan, "phi4flash": phi4flash_plan, "motif2": motif2_plan}
    c = configs[a.family](a.small)
    if a.qk_scale <= 0:
        a.qk_scale = (3.0 / c["hidden_size"]) ** 0.5 / a.std
    os.makedirs(a.out_dir, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(DEMO, f), os.path.join(a.out_dir, f))
    with open(os.path.join(DEMO, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    tok_vocab = max(list(tj["model"]["vocab"].values()) + [t["id"] for t in tj.get("added_tokens", [])]) + 1
    with open(os.path.join(a.out_dir, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
        f.write("\n")

    plan = plans[a.family](c, a, tok_vocab)
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _ in plan:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-(8 + len(hb)) % 8)  # data starts 8-byte aligned, as the safetensors writer pads it
    total = off
    params = total // 2
    print(f"{a.out_dir}: {params / 1e9:.3f} B parameters, {total / 2**30:.2f} GiB of bf16, "
          f"tokenizer vocabulary {tok_vocab} of {c['vocab_size']}", flush=True)

    path = os.path.join(a.out_dir, "model.safetensors")
    tmp = path + ".part"
    t0, done = time.time(), 0
    jobs = []
    for ti, (name, shape, init) in enumerate(plan):
        numel = int(np.prod(shape))
        for s in range(0, numel, CHUNK):
            jobs.append((ti, shape, init, s, min(CHUNK, numel - s)))
    with open(tmp, "wb") as f, ThreadPoolExecutor(max(1, a.threads)) as ex:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        # Bounded look-ahead: at most 2 x threads pieces in memory, written in order.
        window = 2 * max(1, a.threads)
        futs = [ex.submit(piece, a.seed, *j) for j in jobs[:window]]
        nxt = len(futs)
        for k in range(len(jobs)):
            buf = futs[k].result()
            futs[k] = None
            if nxt < len(jobs):
                futs.append(ex.submit(piece, a.seed, *jobs[nxt]))
                nxt += 1
            f.write(buf.tobytes())
            done += buf.size * 2
            if k % 64 == 0 or k == len(jobs) - 1:
                print(f"\r  {done / 2**30:6.2f} / {total / 2**30:.2f} GiB  {time.time() - t0:5.1f} s", end="",
                      file=sys.stderr, flush=True)
    print(file=sys.stderr)
    os.replace(tmp, path)
    print(f"wrote {path} ({os.path.getsize(path) / 2**30:.2f} GiB) in {time.time() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
