#!/usr/bin/env python3
"""Generate the Motif (MotifForCausalLM, model_type "motif") test fixtures in tests/fixtures/motif_*.

    python3 tests/gen_motif_fixtures.py [OUT_DIR]              numpy only; default OUT_DIR tests/fixtures
    python3 tests/gen_motif_fixtures.py [OUT_DIR] --crosscheck also run two other implementations on every fixture
                                                               and print the agreement: torch + einops transcribed
                                                               from Motif's own vLLM code, and (plain Motif only)
                                                               transformers' DiffLlama loaded with mapped weights
    python3 tests/gen_motif_fixtures.py [OUT_DIR] --sensitivity  how far each of ten plausible mistakes moves the logits

Deterministic: weights and token ids come from numpy's default_rng(seed) of each fixture; the expected outputs from
tools/motif_reference.py in float64 (stored as F32). Nothing is downloaded.

Each fixture is a Hugging Face folder as Motif publishes it (config.json with architectures ["MotifForCausalLM"],
model_type "motif", auto_map to configuration_motif / modeling_motif, hidden_act "poly_norm", attn_rms_norm_eps;
real tensor names: model.embed_tokens.weight, model.layers.L.{input_layernorm,post_attention_layernorm}.weight,
self_attn.{q,k,v,o}_proj.weight, self_attn.lambda_{q1,k1,q2,k2}, self_attn.subln.weight,
mlp.{gate,up,down}_proj.weight, mlp.act_fn.weight [3], mlp.act_fn.bias [1], model.norm.weight, lm_head.weight
unless tied) plus expected.safetensors in the format of tests/gen_fixtures.py:
    input_ids            [n] I64           ids[0] = 1
    rope.inv_freq        [d/2] F32
    logits               [n, vocab] F32
    hidden.{l}           [n, hidden] F32   input of decoder layer l; hidden.{L} = last layer's output before the norm
    layers.{l}.attn1     [S, n, n] F32     A1 of signal head i (plain Motif: S = H/2, head i = q heads (2i, 2i+1))
    layers.{l}.attn2     [S, n, n] F32     the noise map signal head i subtracts (plain Motif: q head 2i+1; GDA: the
                                           noise head of its group, repeated for each signal head of the group)
    layers.{l}.lambda    [1] F32           lambda_full of the layer
    override.lambda      [L] F32           lambda forced into every layer for a second run (layer 0: 0)
    override.logits      [n, vocab] F32
    override.layers.{l}.attn1 / attn2
    bf16.*               the logits, hidden.*, layers.*, override.logits and override.layers.* of the same runs
                         as a bf16 engine computes them (tools/motif_reference.py's bf16 emulation): the reference
                         of the CUDA backend's tolerance, since bf16 rounding alone moves these maps by up to 0.07
Weights are perturbed so that a wrong formula shows: norm and subln weights 1 + N(0, .25^2), lambda vectors large
enough that lambda is far from lambda_init, PolyNorm weights/bias away from their (1/3, 0) init and different from each
other, q/k scaled so the maps are far from uniform.
"""
import json
import math
import os
import shutil
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import motif_reference as mr  # noqa: E402

AUTO_MAP = {"AutoConfig": "configuration_motif.MotifConfig",
            "AutoModelForCausalLM": "modeling_motif.MotifForCausalLM"}

FIXTURES = {
    # plain differential attention (Motif-2.6B layout), MHA, f32, untied, realistic eps values
    "motif_mha_d32_f32": dict(hidden=128, layers=2, heads=4, kv=4, head_dim=None, noise=None, inter=64, vocab=192,
                              tie=False, dtype="f32", theta=10000.0, rms_eps=1e-6, attn_eps=1e-5, n=31, seed=11),
    # plain differential attention with GQA (4 q heads = 2 differential heads over 2 kv heads = 1 k1/k2 pair),
    # bf16 weights with the lambda vectors stored F32, tied embeddings, rope_theta of the -LC variant
    "motif_gqa_d64_bf16_tied": dict(hidden=256, layers=2, heads=4, kv=2, head_dim=None, noise=None, inter=32,
                                    vocab=160, tie=True, dtype="bf16", lambda_f32=True, theta=500000.0,
                                    rms_eps=1e-5, attn_eps=5e-3, n=29, seed=12),
    # grouped differential attention (Motif-2-12.7B layout 40/16/8 scaled to 10/4/2: 2 groups of 4 signal + 1
    # noise head, 4 kv heads = 2 pairs), explicit head_dim, sharded, f32; attn_rms_norm_eps far from rms_norm_eps
    # so that an engine using the wrong key for the subln shows
    "motif_gda_d16_sharded_f32": dict(hidden=64, layers=3, heads=10, kv=4, head_dim=16, noise=2, inter=64,
                                      vocab=192, tie=False, dtype="f32", theta=1000000.0, rms_eps=1e-6,
                                      attn_eps=1e-2, n=27, seed=13, shard_bytes=60000),
    # GDA with 4 groups of (2 signal + 1 noise) over 2 kv pairs: two noise heads share a k2/v pair (kv_repeat 2)
    "motif_gda_kvrep2_bf16_tied": dict(hidden=64, layers=2, heads=12, kv=4, head_dim=16, noise=4, inter=64,
                                       vocab=160, tie=True, dtype="bf16", theta=10000.0, rms_eps=1e-5,
                                       attn_eps=1e-5, n=23, seed=14),
}


def make_config(s):
    c = {
        "architectures": ["MotifForCausalLM"],
        "auto_map": AUTO_MAP,
        "model_type": "motif",
        "attention_dropout": 0.0,
        "attn_rms_norm_eps": s["attn_eps"],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "poly_norm",
        "hidden_size": s["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": s["inter"],
        "max_position_embeddings": 256,
        "num_attention_heads": s["heads"],
        "num_hidden_layers": s["layers"],
        "num_key_value_heads": s["kv"],
        "rms_norm_eps": s["rms_eps"],
        "rope_scaling": None,
        "rope_theta": s["theta"],
        "sliding_window": None,
        "tie_word_embeddings": s["tie"],
        "torch_dtype": "bfloat16" if s["dtype"] == "bf16" else "float32",
        "transformers_version": "4.51.3",
        "use_bias": False,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": s["vocab"],
    }
    if s["head_dim"] is not None:
        c["head_dim"] = s["head_dim"]
    if s["noise"] is not None:
        c["num_noise_heads"] = s["noise"]
        c["k_ratio"] = 1
    return c


def make_weights(s):
    """State dict in the order MotifForCausalLM holds it; float64 values before storage rounding."""
    rng = np.random.default_rng(s["seed"])
    H, d = s["hidden"], s["head_dim"] or s["hidden"] // s["heads"]
    hq, hkv = s["heads"], s["kv"]
    noise = s["noise"] if s["noise"] is not None else hq // 2
    signal = hq - noise
    I, V = s["inter"], s["vocab"]

    def lin(o, i, gain=1.0):
        return rng.normal(0.0, gain / math.sqrt(i), (o, i))

    def norm_w(k):
        return 1.0 + 0.25 * rng.normal(size=k)

    lam_std = math.sqrt(0.45) / d ** 0.25  # lambda_q . lambda_k ~ N(0, 0.45^2)
    w = {"model.embed_tokens.weight": rng.normal(0.0, 1.0, (V, H))}
    for l in range(s["layers"]):
        p = f"model.layers.{l}."
        w[p + "self_attn.q_proj.weight"] = lin(hq * d, H, 1.7)
        w[p + "self_attn.k_proj.weight"] = lin(hkv * d, H, 1.7)
        w[p + "self_attn.v_proj.weight"] = lin(hkv * d, H)
        w[p + "self_attn.o_proj.weight"] = lin(H, 2 * signal * d)
        for nm in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            w[p + "self_attn." + nm] = lam_std * rng.normal(size=d)
        w[p + "self_attn.subln.weight"] = 1.0 + 0.3 * rng.normal(size=2 * d)
        w[p + "mlp.gate_proj.weight"] = lin(I, H, 1.5)
        w[p + "mlp.up_proj.weight"] = lin(I, H)
        w[p + "mlp.down_proj.weight"] = lin(H, I)
        w[p + "mlp.act_fn.weight"] = rng.uniform(0.1, 0.9, 3)
        w[p + "mlp.act_fn.bias"] = rng.normal(0.0, 0.3, 1)
        w[p + "input_layernorm.weight"] = norm_w(H)
        w[p + "post_attention_layernorm.weight"] = norm_w(H)
    w["model.norm.weight"] = norm_w(H)
    if not s["tie"]:
        w["lm_head.weight"] = rng.normal(0.0, 1.0 / math.sqrt(H), (V, H))
    ids = rng.integers(3, V, s["n"]).astype(np.int64)
    ids[0] = 1
    return w, ids


def stored(name, a, s):
    if s["dtype"] == "bf16" and not (s.get("lambda_f32") and ".lambda_" in name):
        return mr.BF16(a)
    return np.asarray(a, dtype=np.float32)


def nbytes(t):
    return (t.a.size * 2) if isinstance(t, mr.BF16) else t.nbytes


def write_weights(d, w, s):
    tensors = {k: stored(k, v, s) for k, v in w.items()}
    meta = {"format": "pt"}
    if "shard_bytes" not in s:
        mr.write_safetensors(os.path.join(d, "model.safetensors"), tensors, meta)
        return
    shards, cur, size = [], {}, 0
    for k, t in tensors.items():  # transformers' rule: start a new shard when the next tensor would not fit
        if cur and size + nbytes(t) > s["shard_bytes"]:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = t
        size += nbytes(t)
    shards.append(cur)
    wm, total = {}, 0
    for i, sh in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        mr.write_safetensors(os.path.join(d, fn), sh, meta)
        for k, t in sh.items():
            wm[k] = fn
            total += nbytes(t)
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(wm.items()))}, f, indent=2)
        f.write("\n")


def make(out_root, name, s):
    d = os.path.join(out_root, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(make_config(s), f, indent=2, sort_keys=True)
        f.write("\n")
    w, ids = make_weights(s)
    write_weights(d, w, s)
    model = mr.MotifModel.load(d)  # the reference reads the files back: expected = f(stored weights)
    exp, r, _ = expected_tensors_checked(model, ids)
    mr.write_safetensors(os.path.join(d, "expected.safetensors"), exp,
                         {"generator": "tests/gen_motif_fixtures.py",
                          "reference": "tools/motif_reference.py (float64 numpy)"})
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    lam = ", ".join(f"{v:+.4f}" for v in r["lambda"])
    print(f"{name}: n={len(ids)} lambda [{lam}] files={len(os.listdir(d))} size={size / 1024:.0f} KiB")
    return d, ids


def expected_tensors_checked(model, ids):
    exp, r, o = mr.expected_tensors(model, ids)
    for k, v in exp.items():
        assert np.all(np.isfinite(v)), k
    for l in range(model.cfg.layers):  # the maps are distributions over the causal prefix
        a = r["attn1"][l]
        assert np.allclose(a.sum(-1), 1.0) and np.all(np.triu(a, 1) == 0), l
    return exp, r, o


# ----------------------------------------------------------------------------------------------------------------
# Second implementation, for --crosscheck: torch, transcribed from Motif's vLLM fork (MotifTechnologies/vllm
# @477e4d79: models/motif.py, v1/attention/backends/grouped_diff_attn.py, layers/layernorm.py PolyNorm and RMSNorm,
# rotary_embedding neox) with vLLM's residual/fused-norm decoder loop (models/llama.py). Flash attention is
# torch's scaled_dot_product_attention with enable_gqa (q head h -> kv head h // (Hq/Hkv), flash's GQA rule); the maps,
# which flash attention does not return, are the softmax of each of those calls, written out separately.
# ----------------------------------------------------------------------------------------------------------------
def torch_vllm_forward(folder, ids, lambda_override=None):
    import torch
    import torch.nn.functional as F
    from einops import rearrange, repeat

    dt = torch.float64
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    ck = mr.Checkpoint(folder)
    W = lambda n: torch.from_numpy(ck.get(n)).to(dt)  # noqa: E731

    hidden_size = config["hidden_size"]
    total_num_heads = config["num_attention_heads"]
    num_kv_heads = config.get("num_key_value_heads", total_num_heads)
    num_noise_heads = config.get("num_noise_heads", total_num_heads // 2)  # MotifDecoderLayer: safe_half
    head_dim = config.get("head_dim") or hidden_size // total_num_heads
    q_size, kv_size, scaling = total_num_heads * head_dim, num_kv_heads * head_dim, head_dim ** -0.5
    num_q1_heads = total_num_heads - num_noise_heads
    num_q2_heads = num_noise_heads
    num_q_head_groups = num_q2_heads
    q_head_group_size = total_num_heads // num_q_head_groups
    q_head_group_ratio = num_q1_heads // num_q2_heads
    assert num_q1_heads % (num_kv_heads // 2) == 0 and num_q2_heads % (num_kv_heads // 2) == 0

    # vLLM RotaryEmbedding, neox style
    base = config.get("rope_theta", 10000)
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=dt) / head_dim))
    t = torch.arange(len(ids), dtype=dt)
    freqs = torch.einsum("i,j -> ij", t, inv_freq)
    cos_sin_cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    positions = torch.arange(len(ids))

    def rotary(x, nheads):
        cos, sin = cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
        x = x.view(len(ids), nheads, head_dim)
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        x1, x2 = torch.chunk(x, 2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).reshape(len(ids), -1)

    def rmsnorm(x, weight, eps, residual=None):  # vLLM RMSNorm.forward_native
        x = x.to(torch.float64)
        if residual is not None:
            x = x + residual
            residual = x
        variance = x.pow(2).mean(dim=-1, keepdim=True)
        x = x * torch.rsqrt(variance + eps)
        x = x * weight
        return x if residual is None else (x, residual)

    def polynorm(x, weight, bias, eps=1e-6):  # vLLM PolyNorm.forward_native, tp_size 1
        x_float = x.to(torch.float64)
        x_2 = x_float.pow(2)
        x_2_sum = x_2.sum(-1, keepdim=True)
        x_3 = x_2 * x_float
        x_4_sum = (x_2 * x_2).sum(-1, keepdim=True)
        x_6_sum = (x_3 * x_3).sum(-1, keepdim=True)
        Hn = x.shape[-1]
        norm = lambda v, mean: v / torch.sqrt(mean + eps)  # noqa: E731
        return (weight[0] * norm(x_3, x_6_sum / Hn) + weight[1] * norm(x_2, x_4_sum / Hn)
                + weight[2] * norm(x_float, x_2_sum / Hn) + bias)

    maps = {}

    def flash(query, key, value, tag):  # flash_attn_varlen_func(causal=True, softmax_scale=scaling), one sequence
        q, k, v = (a.transpose(0, 1)[None] for a in (query, key, value))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=True)
        rep = q.shape[1] // k.shape[1]
        s = (q @ k.repeat_interleave(rep, dim=1).transpose(-1, -2)) * scaling
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
        maps[tag] = torch.softmax(s, dim=-1)[0]
        return out[0].transpose(0, 1)

    def split_q_heads(q):
        q = rearrange(q, "... (num_groups group_size) D -> ... num_groups group_size D",
                      num_groups=num_q_head_groups, group_size=q_head_group_size)
        local_q1_heads = num_q1_heads // num_q_head_groups
        return q[..., :local_q1_heads, :].flatten(-3, -2), q[..., local_q1_heads:, :].flatten(-3, -2)

    def split_heads(x):
        x = rearrange(x, "... (H two) D -> ... H two D", two=2)
        return x[..., 0, :], x[..., 1, :]

    layers = config["num_hidden_layers"]
    hidden, lambdas, m1, m2 = [], [], [], []
    hidden_states = W("model.embed_tokens.weight")[torch.as_tensor(np.asarray(ids))]
    residual = None
    for l in range(layers):
        p = f"model.layers.{l}."
        hidden.append(hidden_states if residual is None else hidden_states + residual)
        if residual is None:
            residual = hidden_states
            hidden_states = rmsnorm(hidden_states, W(p + "input_layernorm.weight"), config["rms_norm_eps"])
        else:
            hidden_states, residual = rmsnorm(hidden_states, W(p + "input_layernorm.weight"),
                                              config["rms_norm_eps"], residual)
        # MotifAttention.forward
        a = p + "self_attn."
        qkv = hidden_states @ torch.cat([W(a + "q_proj.weight"), W(a + "k_proj.weight"), W(a + "v_proj.weight")]).T
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q, k = rotary(q, total_num_heads), rotary(k, num_kv_heads)
        lambda_init = 0.8 - 0.6 * math.exp(-0.3 * (l - 1))  # lambda_init_fn(depth), depth = extract_layer_index
        lambda_1 = torch.exp(torch.sum(W(a + "lambda_q1") * W(a + "lambda_k1"), dim=-1).double()).type_as(q)
        lambda_2 = torch.exp(torch.sum(W(a + "lambda_q2") * W(a + "lambda_k2"), dim=-1).double()).type_as(q)
        lambda_full = lambda_1 - lambda_2 + lambda_init
        if lambda_override is not None:
            lambda_full = torch.tensor(float(lambda_override[l]), dtype=dt)
        lambdas.append(float(lambda_full))
        # GroupedDifferentialAttentionImpl.forward
        q = q.view(-1, total_num_heads, head_dim)
        k = k.view(-1, num_kv_heads, head_dim)
        v = v.view(-1, num_kv_heads, head_dim)
        q1, q2 = split_q_heads(q)
        k1, k2 = split_heads(k)
        v1, v2 = split_heads(v)
        attn11 = flash(q1, k1, v1, "1")
        attn12 = flash(q1, k1, v2, "1b")
        attn1 = torch.cat([attn11, attn12], dim=-1)
        attn21 = flash(q2, k2, v1, "2")
        attn22 = flash(q2, k2, v2, "2b")
        attn2 = torch.cat([attn21, attn22], dim=-1)
        attn2 = repeat(attn2, "... H D -> ... (H r) D", r=q_head_group_ratio)
        attn = attn1 - lambda_full * attn2
        attn = rmsnorm(attn, W(a + "subln.weight"), config["attn_rms_norm_eps"])
        attn = attn * (1 - lambda_init)
        attn_output = rearrange(attn, "... H (two D) -> ... (H two) D", two=2)
        attn_output = attn_output.reshape(-1, 2 * num_q1_heads * head_dim)
        hidden_states = attn_output @ W(a + "o_proj.weight").T
        m1.append(maps["1"].numpy())
        m2.append(repeat(maps["2"], "H n m -> (H r) n m", r=q_head_group_ratio).numpy())
        # post norm + MotifMLP
        hidden_states, residual = rmsnorm(hidden_states, W(p + "post_attention_layernorm.weight"),
                                          config["rms_norm_eps"], residual)
        inter = config["intermediate_size"]
        x = hidden_states @ torch.cat([W(p + "mlp.gate_proj.weight"), W(p + "mlp.up_proj.weight")]).T
        x = polynorm(x[..., :inter], W(p + "mlp.act_fn.weight"), W(p + "mlp.act_fn.bias")) * x[..., inter:]
        hidden_states = x @ W(p + "mlp.down_proj.weight").T
    hidden.append(hidden_states + residual)
    hidden_states, _ = rmsnorm(hidden_states, W("model.norm.weight"), config["rms_norm_eps"], residual)
    lm = W("model.embed_tokens.weight") if config.get("tie_word_embeddings") else W("lm_head.weight")
    logits = hidden_states @ lm.T
    return {"logits": logits.numpy(), "hidden": [h.numpy() for h in hidden], "attn1": m1, "attn2": m2,
            "lambda": lambdas}


def transformers_diffllama_forward(folder, ids, lambda_override=None):
    """Third check, for plain Motif only: transformers' own DiffLlama (eager, float64) loaded with the Motif weights
    mapped onto its layout -- the mapping docs/models/motif.md proposes to a DiffLlama engine:
      q/k/v rows: head blocks reordered [0, 2, 4, ..; 1, 3, 5, ..] (interleaved pairs -> chunked halves)
      o_proj: columns of each 2d block times subln.weight (Motif's subln has a learned weight, DiffLlama's none)
      lambda_init: Motif's 0.8 - 0.6 exp(-0.3 (l - 1)) written into each DiffLlamaAttention.lambda_init
      groupnorm eps: attn_rms_norm_eps;  mlp.act_fn: PolyNorm with the layer's act_fn.weight / act_fn.bias
    Returns logits and the maps DiffLlama returns with output_attentions (A1 heads j, A2 heads j + H/2)."""
    import torch
    from transformers import DiffLlamaConfig, DiffLlamaForCausalLM

    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    if "num_noise_heads" in c:
        raise ValueError("grouped attention has no DiffLlama equivalent without replicating noise heads")
    ck = mr.Checkpoint(folder)
    T = lambda n: torch.from_numpy(ck.get(n))  # noqa: E731
    H, Hkv, hid = c["num_attention_heads"], c["num_key_value_heads"], c["hidden_size"]
    d = c.get("head_dim") or hid // H
    cfg = DiffLlamaConfig(hidden_size=hid, num_hidden_layers=c["num_hidden_layers"], num_attention_heads=H,
                          num_key_value_heads=Hkv, head_dim=d, intermediate_size=c["intermediate_size"],
                          vocab_size=c["vocab_size"], rms_norm_eps=c["rms_norm_eps"],
                          rope_parameters={"rope_type": "default", "rope_theta": c["rope_theta"]},
                          tie_word_embeddings=bool(c["tie_word_embeddings"]), max_position_embeddings=256)
    model = DiffLlamaForCausalLM._from_config(cfg, attn_implementation="eager").double().eval()

    class PolyNorm(torch.nn.Module):  # the published formula (HF modeling_motif.py PolyNorm as quoted by ports)
        def __init__(self, w, b, eps=1e-6):
            super().__init__()
            self.weight, self.bias, self.eps = w, b, eps

        def _norm(self, x):
            return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

        def forward(self, x):
            return (self.weight[0] * self._norm(x ** 3) + self.weight[1] * self._norm(x ** 2)
                    + self.weight[2] * self._norm(x) + self.bias)

    def chunked(w, heads):
        blocks = w.reshape(heads, d, -1)
        return torch.cat([blocks[0::2], blocks[1::2]]).reshape(heads * d, -1)

    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    model.model.rotary_emb.inv_freq = inv
    model.model.rotary_emb.original_inv_freq = inv

    def rotary64(x, position_ids):  # transformers builds cos/sin in float32 even in a float64 model
        freqs = position_ids[..., None].double() * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()
    model.model.rotary_emb.forward = rotary64
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(T("model.embed_tokens.weight"))
        model.model.norm.weight.copy_(T("model.norm.weight"))
        if not c["tie_word_embeddings"]:
            model.lm_head.weight.copy_(T("lm_head.weight"))
        for l, layer in enumerate(model.model.layers):
            p = f"model.layers.{l}."
            at = layer.self_attn
            at.q_proj.weight.copy_(chunked(T(p + "self_attn.q_proj.weight"), H))
            at.k_proj.weight.copy_(chunked(T(p + "self_attn.k_proj.weight"), Hkv))
            at.v_proj.weight.copy_(chunked(T(p + "self_attn.v_proj.weight"), Hkv))
            at.o_proj.weight.copy_(T(p + "self_attn.o_proj.weight") * T(p + "self_attn.subln.weight").repeat(H // 2))
            at.lambda_init = mr.lambda_init_of(l)
            at.groupnorm.eps = c["attn_rms_norm_eps"]
            for nm in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                getattr(at, nm).copy_(T(p + "self_attn." + nm))
            if lambda_override is not None:  # exp(s) - exp(0) + lambda_init = wanted
                s1 = math.log(lambda_override[l] - at.lambda_init + 1.0)
                for nm in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                    getattr(at, nm).zero_()
                at.lambda_q1[0] = math.sqrt(abs(s1))
                at.lambda_k1[0] = math.copysign(math.sqrt(abs(s1)), s1)
            layer.input_layernorm.weight.copy_(T(p + "input_layernorm.weight"))
            layer.post_attention_layernorm.weight.copy_(T(p + "post_attention_layernorm.weight"))
            layer.mlp.gate_proj.weight.copy_(T(p + "mlp.gate_proj.weight"))
            layer.mlp.up_proj.weight.copy_(T(p + "mlp.up_proj.weight"))
            layer.mlp.down_proj.weight.copy_(T(p + "mlp.down_proj.weight"))
            layer.mlp.act_fn = PolyNorm(T(p + "mlp.act_fn.weight"), T(p + "mlp.act_fn.bias"))
        o = model(input_ids=torch.as_tensor(np.asarray(ids))[None], output_attentions=True, use_cache=False)
    return {"logits": o.logits[0].numpy(), "attn1": [a[0, : H // 2].numpy() for a in o.attentions],
            "attn2": [a[0, H // 2:].numpy() for a in o.attentions]}


def compare(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b))), float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def crosscheck(folder, ids):
    model = mr.MotifModel.load(folder)
    L = model.cfg.layers
    ov = mr.default_override(L)
    rows = []
    for tag, over in (("", None), ("override.", ov)):
        ref = model.forward(ids, lambda_override=over)
        alt = torch_vllm_forward(folder, ids, lambda_override=over)
        rows.append((tag + "logits",) + compare(alt["logits"], ref["logits"]))
        if not tag:
            rows.append(("hidden.*",) + max((compare(alt["hidden"][l], ref["hidden"][l]) for l in range(L + 1)),
                                            key=lambda t: t[1]))
            rows.append(("lambda",) + compare(alt["lambda"], ref["lambda"]))
        for m in ("attn1", "attn2"):
            rows.append((tag + "layers.*." + m,) + max((compare(alt[m][l], ref[m][l]) for l in range(L)),
                                                       key=lambda t: t[1]))
    if not model.cfg.grouped:
        for tag, over in (("", None), ("override.", ov)):
            ref = model.forward(ids, lambda_override=over)
            alt = transformers_diffllama_forward(folder, ids, lambda_override=over)
            rows.append(("DiffLlama-mapped " + tag + "logits",) + compare(alt["logits"], ref["logits"]))
            for m in ("attn1", "attn2"):
                rows.append(("DiffLlama-mapped " + tag + m,) + max(
                    (compare(alt[m][l], ref[m][l]) for l in range(L)), key=lambda t: t[1]))
    # what the fixture stores (f32) against the float64 reference
    exp = mr.SafetensorsFile(os.path.join(folder, "expected.safetensors"))
    rows.append(("stored logits (f32) vs f64",) + compare(exp.get("logits"), model.forward(ids)["logits"]))
    return rows


# ----------------------------------------------------------------------------------------------------------------
# --sensitivity: how far plausible implementation mistakes move the fixtures' logits (relative Frobenius error),
# each against tools/motif_reference.py; the fixtures are only useful if every one of these is well above 1e-4.
# ----------------------------------------------------------------------------------------------------------------
class Variant(mr.MotifModel):
    """The reference with one deliberate mistake (self.mode), for --sensitivity."""
    mode = None

    def lambda_init(self, l):
        return 0.8 - 0.6 * math.exp(-0.3 * l) if self.mode == "lambda_init_no_offset" else mr.lambda_init_of(l)

    def layer_lambda(self, l):
        return super().layer_lambda(l) - mr.lambda_init_of(l) + self.lambda_init(l)

    def attention(self, l, h, cos, sin, lam):
        c, ck, mode = self.cfg, self.ckpt, self.mode
        p = f"model.layers.{l}.self_attn."
        n, d = h.shape[0], c.head_dim
        q = mr.linear(h, ck.get(p + "q_proj.weight")).reshape(n, c.hq, d)
        k = mr.linear(h, ck.get(p + "k_proj.weight")).reshape(n, c.hkv, d)
        v = mr.linear(h, ck.get(p + "v_proj.weight")).reshape(n, c.hkv, d)
        if mode == "rope_gptj":  # adjacent pairs (2i, 2i+1) instead of (i, i + d/2)
            def gptj(x):
                out = np.empty_like(x)
                cc, ss = cos[:, None, :], sin[:, None, :]
                out[..., 0::2] = x[..., 0::2] * cc - x[..., 1::2] * ss
                out[..., 1::2] = x[..., 1::2] * cc + x[..., 0::2] * ss
                return out
            q, k = gptj(q), gptj(k)
        else:
            q, k = mr.rope_neox(q, cos, sin), mr.rope_neox(k, cos, sin)
        if mode == "chunked_pairs":  # DiffLlama's reading: A1 = q head j, A2 = q head j + H/2 (k, v likewise)
            def unchunk(heads):
                return np.argsort(list(range(0, heads, 2)) + list(range(1, heads, 2)))
            q, k, v = q[:, unchunk(c.hq)], k[:, unchunk(c.hkv)], v[:, unchunk(c.hkv)]
        k1, k2, v1, v2 = k[:, 0::2], k[:, 1::2], v[:, 0::2], v[:, 1::2]
        scale = 1.0 / math.sqrt(d)
        o2 = []
        for g in range(c.noise):
            pp = c.noise_pair(g)
            a = mr.softmax_causal((q[:, g * c.group + c.gr] @ k2[:, pp].T) * scale)
            o2.append(a @ np.concatenate([v1[:, pp], v2[:, pp]], -1))
        w_sub = None if mode == "subln_no_weight" else ck.get(p + "subln.weight")
        eps = c.rms_eps if mode == "subln_eps_rms" else c.attn_eps
        outs = []
        for i in range(c.signal):
            g, r = divmod(i, c.gr)
            pp = c.signal_pair(i)
            vv = np.concatenate([v1[:, pp], v2[:, pp]], -1)
            if mode == "naive_gqa":  # unilm's naive repeat_kv: q head m -> k head m // n_rep, for both halves
                nrep = c.hq // c.hkv
                a1 = mr.softmax_causal((q[:, g * c.group + r] @ k[:, (g * c.group + r) // nrep].T) * scale)
                a2 = mr.softmax_causal((q[:, g * c.group + c.gr] @ k[:, (g * c.group + c.gr) // nrep].T) * scale)
                o = a1 @ vv - lam * (a2 @ vv)
            else:
                a1 = mr.softmax_causal((q[:, g * c.group + r] @ k1[:, pp].T) * scale)
                o = a1 @ vv - lam * o2[i % c.noise if mode == "gda_noise_modulo" else g]
            o = mr.rms_norm(o, w_sub, eps)
            if mode != "no_one_minus_lambda_init":
                o = o * (1.0 - self.lambda_init(l))
            outs.append(o)
        return mr.linear(np.concatenate(outs, -1), ck.get(p + "o_proj.weight")), None, None

    def mlp(self, l, x):
        ck, p = self.ckpt, f"model.layers.{l}.mlp."
        gate, up = x @ ck.get(p + "gate_proj.weight").T, x @ ck.get(p + "up_proj.weight").T
        w, b = ck.get(p + "act_fn.weight"), ck.get(p + "act_fn.bias")
        if self.mode == "polynorm_reversed":  # weight[0] on N(x) instead of N(x^3)
            w = w[::-1]
        if self.mode == "polynorm_on_up":
            gate, up = up, gate
        return (mr.poly_norm(gate, w, b) * up) @ ck.get(p + "down_proj.weight").T


modes = ["lambda_init_no_offset", "chunked_pairs", "rope_gptj", "subln_no_weight", "subln_eps_rms",
         "no_one_minus_lambda_init", "polynorm_reversed", "polynorm_on_up", "naive_gqa", "gda_noise_modulo"]


def sensitivity(folder, ids):
    base = mr.MotifModel.load(folder)
    ref = base.forward(ids)["logits"]
    rel = lambda a, b: float(np.linalg.norm(a - b) / np.linalg.norm(b))  # noqa: E731
    rows = []
    for m in modes:
        if m == "naive_gqa" and (base.cfg.grouped or base.cfg.hq == base.cfg.hkv):
            continue
        if m == "gda_noise_modulo" and not base.cfg.grouped:
            continue
        if m == "chunked_pairs" and base.cfg.grouped:
            continue
        v = Variant(base.cfg, base.ckpt)
        v.mode = m
        rows.append((m, rel(v.forward(ids, want_maps=False)["logits"], ref)))
    return rows


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    out = args[0] if args else os.path.join(ROOT, "tests", "fixtures")
    os.makedirs(out, exist_ok=True)
    made = [make(out, name, spec) for name, spec in FIXTURES.items()]
    if "--crosscheck" in sys.argv:
        worst = {"vllm": [0.0, 0.0], "DiffLlama": [0.0, 0.0]}
        for (d, ids) in made:
            print(f"crosscheck {os.path.basename(d)} against tools/motif_reference.py (both float64)")
            for name, ab, rel in crosscheck(d, ids):
                print(f"  {name:34s} max abs {ab:.3e}  rel {rel:.3e}")
                if not name.startswith("stored"):
                    w = worst["DiffLlama" if name.startswith("DiffLlama") else "vllm"]
                    w[0], w[1] = max(w[0], ab), max(w[1], rel)
        print("crosscheck worst: torch/vLLM-fork structure max abs {:.3e} rel {:.3e}; transformers DiffLlama-mapped "
              "max abs {:.3e} rel {:.3e}".format(*worst["vllm"], *worst["DiffLlama"]))
        assert worst["vllm"][1] < 1e-12, "the torch transcription of Motif's vLLM code disagrees"
        # transformers' eager DiffLlama takes the softmax (dtype=torch.float32) and the lambda dot products in float32
        # even in a float64 model, hence its ~3e-7 floor; every formula mistake tried by --sensitivity is >= 1e-3
        assert worst["DiffLlama"][1] < 1e-5, "transformers' DiffLlama with the mapped weights disagrees"
    if "--sensitivity" in sys.argv:
        for (d, ids) in made:
            print(os.path.basename(d) + ": " + "; ".join(f"{m} {r:.1e}" for m, r in sensitivity(d, ids)))


if __name__ == "__main__":
    main()
