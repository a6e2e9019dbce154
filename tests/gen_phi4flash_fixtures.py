#!/usr/bin/env python3
"""Generate the Phi-4-mini-flash (Phi4FlashForCausalLM, model_type "phi4flash", SambaY) test fixtures in
tests/fixtures/phi4flash_*.

    python3 tests/gen_phi4flash_fixtures.py [OUT_DIR]          numpy only; default OUT_DIR tests/fixtures
    python3 tests/gen_phi4flash_fixtures.py [OUT_DIR] --crosscheck SRC
        also run the PUBLISHED modeling_phi4flash.py + configuration_phi4flash.py (folder SRC, e.g. the
        Phi-4-mini-flash-reasoning/ folder of franciskamande-ai/cloned_models @711ebe7d) in torch float64 on CPU,
        with its CUDA-only dependencies (flash_attn, causal_conv1d, mamba_ssm, selective_scan_cuda, the jiterator
        SwiGLU) replaced by plain torch functions written from their documented semantics, and print the agreement
        with the stored expected tensors (needs torch + einops + transformers; see crosscheck_published)
    python3 tests/gen_phi4flash_fixtures.py [OUT_DIR] --sensitivity
        how far each of several plausible mistakes moves the logits and maps (numpy only)

Deterministic: weights and token ids come from numpy's default_rng(seed) of each fixture; the expected outputs
from tools/phi4flash_reference.py in float64 (stored as F32), computed from the weights as written (read back).

Each fixture is a Hugging Face folder as Microsoft publishes the model: config.json with the keys of the official
config.json (architectures ["Phi4FlashForCausalLM"], model_type "phi4flash", auto_map, mb_per_layer 2,
sliding_window as a scalar, layer_norm_eps, tie_word_embeddings true, no mamba_* keys: the official config has none,
so d_state 16, d_conv 4, expand 2, dt_rank ceil(hidden/16) apply), real tensor names
(model.embed_tokens.weight, model.layers.N.{input,post_attention}_layernorm.{weight,bias}, mlp.fc1/fc2.weight,
attn.{in_proj,conv1d,x_proj,dt_proj,out_proj}, attn.A_log, attn.D, attn.Wqkv.{weight,bias},
attn.out_proj.{weight,bias}, attn.inner_cross_attn.lambda_{q1,k1,q2,k2}, attn.inner_cross_attn.subln.weight,
model.final_layernorm.{weight,bias}; no lm_head.weight: tied), plus expected.safetensors:
    input_ids                    [n] I64
    logits                       [n, vocab] F32
    hidden.{l}                   [n, hidden] F32   input of layer l; hidden.{L} = last layer output before the norm
    layers.{l}.attn1 / attn2     [H/2, n, n] F32   for each differential layer l (swa, full, cross): A1 / A2 of
                                                   differential head j = q heads (2j, 2j+1) over k heads
                                                   (2g, 2g+1), g = j // (H/Hkv); masked entries 0
    layers.{l}.lambda            [1] F32
    override.lambda              [number of differential layers] F32, in layer order (first: 0)
    override.logits, override.layers.{l}.attn1 / attn2
    bf16.*                       logits, hidden.*, layers.*.attn1/2, override.logits, override.layers.* of the same
                                 runs under tools/phi4flash_reference.py's bf16 emulation
Weights are perturbed so that a wrong formula shows: LayerNorm weights 1 + N(0, .2^2) and biases N(0, .1^2),
subln weights 1 + N(0, .25^2), Wqkv / out_proj biases nonzero, lambda vectors so that lambda is far from lambda_init,
A_log away from log(1..16), D away from 1, dt biases spread so that delta ranges over ~0.02..1.
"""
import json
import math
import os
import shutil
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import phi4flash_reference as pr  # noqa: E402



QK_GAIN = 0.7
AUTO_MAP = {"AutoConfig": "configuration_phi4flash.Phi4FlashConfig",
            "AutoModelForCausalLM": "modeling_phi4flash.Phi4FlashForCausalLM",
            "AutoTokenizer": "Xenova/gpt-4o"}

FIXTURES = {
    # L = 8 is the smallest depth with every layer kind (L = 4 has mamba, swa, memory, full only):
    # 0 mamba, 1 swa, 2 mamba, 3 swa, 4 memory, 5 full, 6 gmu, 7 cross. MHA: differential head j reads pair j.
    "phi4flash_L8_mha_f32": dict(hidden=32, layers=8, heads=4, kv=4, inter=48, vocab=96, window=8, n=30,
                                 dtype="f32", seed=21),
    # GQA with the real ratio H:Hkv = 2 (40:20): 4 differential heads over 2 k/v pairs (heads 0,1 -> pair 0,
    # heads 2,3 -> pair 1); BF16 weights with A_log and the lambda vectors F32, as the real shards
    "phi4flash_L8_gqa_bf16": dict(hidden=64, layers=8, heads=8, kv=4, inter=32, vocab=96, window=8, n=26,
                                  dtype="bf16", seed=22),
    # L = 12 (half 6): 0..5 alternate mamba/swa, 6 memory, 7 full, 8/10 gmu, 9/11 cross; GQA 4:2 (one pair),
    # window 6, sharded into several files with model.safetensors.index.json
    "phi4flash_L12_gqa_sharded_f32": dict(hidden=32, layers=12, heads=4, kv=2, inter=32, vocab=80, window=6, n=26,
                                          dtype="f32", seed=23, shard_bytes=60000),
}


def make_config(s):
    v = s["vocab"]
    return {
        "architectures": ["Phi4FlashForCausalLM"],
        "attention_dropout": 0.0,
        "auto_map": AUTO_MAP,
        "pad_token_id": v - 1,
        "bos_token_id": v - 1,
        "embd_pdrop": 0.0,
        "eos_token_id": v - 1,
        "hidden_act": "silu",
        "hidden_size": s["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": s["inter"],
        "layer_norm_eps": 1e-5,
        "max_position_embeddings": 256,
        "_attn_implementation": "flash_attention_2",
        "mb_per_layer": 2,
        "model_type": "phi4flash",
        "num_attention_heads": s["heads"],
        "num_hidden_layers": s["layers"],
        "num_key_value_heads": s["kv"],
        "resid_pdrop": 0.0,
        "sliding_window": s["window"],
        "torch_dtype": "bfloat16" if s["dtype"] == "bf16" else "float32",
        "tie_word_embeddings": True,
        "transformers_version": "4.46.1",
        "use_cache": True,
        "mlp_bias": False,
        "lm_head_bias": False,
        "vocab_size": v,
    }


def make_weights(s, cfg):
    rng = np.random.default_rng(s["seed"])
    H, Hkv, hid = s["heads"], s["kv"], s["hidden"]
    d = hid // H
    di, S, R, K = cfg.d_inner, cfg.d_state, cfg.dt_rank, cfg.d_conv
    w = {}

    def lin(o, i, gain=1.0):
        return rng.standard_normal((o, i)) * (gain / math.sqrt(i))

    def ln(name):
        w[name + ".weight"] = 1.0 + 0.2 * rng.standard_normal(hid)
        w[name + ".bias"] = 0.1 * rng.standard_normal(hid)

    w["model.embed_tokens.weight"] = 0.5 * rng.standard_normal((s["vocab"], hid))
    for l in range(s["layers"]):
        p = f"model.layers.{l}."
        kind = cfg.kinds[l]
        ln(p + "input_layernorm")
        a = p + "attn."
        if kind in ("mamba", "memory"):
            w[a + "in_proj.weight"] = lin(2 * di, hid)
            w[a + "conv1d.weight"] = (0.5 * rng.standard_normal((di, 1, K)))
            w[a + "conv1d.bias"] = 0.2 * rng.standard_normal(di)
            w[a + "x_proj.weight"] = lin(R + 2 * S, di, 1.0)
            w[a + "dt_proj.weight"] = lin(di, R, 0.5)
            dt = np.exp(rng.uniform(math.log(0.02), math.log(0.3), di))
            w[a + "dt_proj.bias"] = dt + np.log(-np.expm1(-dt))  # inverse softplus (Mamba's init formula)
            w[a + "A_log"] = np.log(np.tile(np.arange(1, S + 1, dtype=np.float64), (di, 1))) \
                + 0.3 * rng.standard_normal((di, S))
            w[a + "D"] = 1.0 + 0.4 * rng.standard_normal(di)
            w[a + "out_proj.weight"] = lin(hid, di)
        elif kind == "gmu":
            w[a + "in_proj.weight"] = lin(di, hid, 1.5)
            w[a + "out_proj.weight"] = lin(hid, di)
        else:
            qd = H * d
            rows = qd if kind == "cross" else qd + 2 * Hkv * d
            W = lin(rows, hid)
            W[:qd] *= QK_GAIN  # q
            if kind != "cross":
                W[qd:qd + Hkv * d] *= QK_GAIN  # k
            w[a + "Wqkv.weight"] = W
            w[a + "Wqkv.bias"] = 0.3 * rng.standard_normal(rows)
            w[a + "out_proj.weight"] = lin(hid, qd)
            w[a + "out_proj.bias"] = 0.1 * rng.standard_normal(hid)
            c = a + "inner_cross_attn."
            for t in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                w[c + t] = 0.25 * rng.standard_normal(d) + (0.12 if t.endswith("1") else -0.05)
            w[c + "subln.weight"] = 1.0 + 0.25 * rng.standard_normal(2 * d)
        ln(p + "post_attention_layernorm")
        w[p + "mlp.fc1.weight"] = lin(2 * s["inter"], hid)
        w[p + "mlp.fc2.weight"] = lin(hid, s["inter"])
    ln("model.final_layernorm")
    return w


def stored(name, a, s):
    """The tensor as written: F32, or BF16 except A_log and the lambda vectors (F32 in the real shards; derived
    from model.safetensors.index.json's total_size, docs/models/phi4flash.md)."""
    if s["dtype"] == "bf16" and not (name.endswith(".A_log") or ".lambda_" in name):
        return pr.BF16(a)
    return np.asarray(a, dtype=np.float32)


def nbytes(t):
    return t.a.size * 2 if isinstance(t, pr.BF16) else t.nbytes


def write_weights(d, w, s):
    t = {k: stored(k, v, s) for k, v in w.items()}
    if "shard_bytes" not in s:
        pr.write_safetensors(os.path.join(d, "model.safetensors"), t, {"format": "pt"})
        return
    shards, cur, size = [], {}, 0
    for k, v in t.items():
        if cur and size + nbytes(v) > s["shard_bytes"]:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = v
        size += nbytes(v)
    shards.append(cur)
    wm, total = {}, 0
    for i, sh in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        pr.write_safetensors(os.path.join(d, fn), sh, {"format": "pt"})
        for k, v in sh.items():
            wm[k] = fn
            total += nbytes(v)
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2)


def make(out_root, name, s):
    d = os.path.join(out_root, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    cj = make_config(s)
    cfg = pr.Phi4FlashConfig(cj)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cj, f, indent=2, sort_keys=True)
        f.write("\n")
    write_weights(d, make_weights(s, cfg), s)
    rng = np.random.default_rng(s["seed"] + 1000)
    ids = rng.integers(0, s["vocab"], s["n"]).astype(np.int64)
    m = pr.Phi4FlashModel.load(d)  # read back: the expected tensors come from the weights as stored
    t, res = pr.expected_tensors(m, ids)
    pr.write_safetensors(os.path.join(d, "expected.safetensors"), t, {"generator": "tests/gen_phi4flash_fixtures.py"})
    r = res[""][0]
    rb = res["bf16."][0]
    mx = lambda a, b: float(np.max(np.abs(a - b)))
    dm = max(max(mx(r["attn1"][l], rb["attn1"][l]), mx(r["attn2"][l], rb["attn2"][l])) for l in cfg.diff_layers)
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    print(f"{name}: {size} bytes; kinds {' '.join(cfg.kinds)}; lambdas "
          + ", ".join(f"{l}:{r['lambda'][l]:+.3f}" for l in cfg.diff_layers)
          + f"; |logits| max {np.abs(r['logits']).max():.2f}; bf16 emulation: maps moved {dm:.4f}, logits moved "
          f"{mx(r['logits'], rb['logits']):.4f}")
    return d, ids


# ------------------------------------------------------------------------------------------------------------
# sensitivity: how far plausible mistakes move the outputs
# ------------------------------------------------------------------------------------------------------------
def sensitivity(folder, ids):
    base = pr.Phi4FlashModel.load(folder)
    ref = base.forward(ids)
    c = base.cfg
    results = {}

    # 1. lambda_init counted over differential layers only
    old = pr.lambda_init_of
    dl = c.diff_layers
    pr.lambda_init_of = lambda l: old(dl.index(l) if l in dl else l)
    results["lambda_init over diff layers only"] = base.forward(ids)
    pr.lambda_init_of = lambda l: old(l - 1)
    results["lambda_init(l-1) (Motif)"] = base.forward(ids)
    pr.lambda_init_of = old
    # 2. window w+1 keys
    sv = list(c.window)
    c.window[:] = [None if v is None else v + 1 for v in sv]
    results["window w+1 keys"] = base.forward(ids)
    c.window[:] = [None if v is None else v - 1 for v in sv]
    results["window w-1 keys"] = base.forward(ids)
    c.window[:] = sv
    # 3. differential head j reading k/v pair j % (Hkv/2) instead of j // (H/Hkv)
    if c.hq != c.hkv:
        orig_pair = c.kv_pair
        c.kv_pair = lambda j: j % (c.hkv // 2)
        results["kv pair j % (Hkv/2)"] = base.forward(ids)
        c.kv_pair = orig_pair
    # 4. memory gated / GMU without silu / conv bias ignored / dt bias twice / no D skip, via small patches
    orig_mamba = pr.Phi4FlashModel.mamba

    def patched(fn):
        pr.Phi4FlashModel.mamba = fn
        try:
            return base.forward(ids)
        finally:
            pr.Phi4FlashModel.mamba = orig_mamba

    def gmu_no_silu(self, l, h, kind, memory):
        if kind == "gmu":
            p = f"model.layers.{l}.attn."
            a = self._lin(h, p + "in_proj.weight")
            return self._lin(a * memory, p + "out_proj.weight"), memory
        return orig_mamba(self, l, h, kind, memory)
    results["GMU without silu"] = patched(gmu_no_silu)

    def memory_gated(self, l, h, kind, memory):
        out, mem = orig_mamba(self, l, h, kind, memory)
        if kind == "memory":
            p = f"model.layers.{l}.attn."
            z = self._lin(h, p + "in_proj.weight")[:, self.cfg.d_inner:]
            mem = mem * pr.silu(z)
        return out, mem
    results["memory = gated y"] = patched(memory_gated)

    orig_get = base.ckpt.get

    def no_tensor(suffix, value_fn):
        def g(name):
            a = orig_get(name)
            return value_fn(a) if name.endswith(suffix) else a
        base.ckpt.get = g
        try:
            return base.forward(ids)
        finally:
            base.ckpt.get = orig_get
    results["no D skip"] = no_tensor(".attn.D", np.zeros_like)
    results["dt_proj.bias ignored"] = no_tensor("dt_proj.bias", np.zeros_like)
    results["no subln weight"] = no_tensor("subln.weight", np.ones_like)
    results["LayerNorm bias ignored"] = no_tensor("layernorm.bias", np.zeros_like)
    results["no Wqkv bias"] = no_tensor("Wqkv.bias", np.zeros_like)
    print(f"{os.path.basename(folder)}: max |d logits| (max |d map| over differential layers)")
    for k, r in results.items():
        dl_ = float(np.max(np.abs(r["logits"] - ref["logits"])))
        dm = max(float(np.max(np.abs(r["attn1"][l] - ref["attn1"][l]))) for l in c.diff_layers)
        print(f"  {k:40s} {dl_:10.4f} ({dm:.4f})")


# ------------------------------------------------------------------------------------------------------------
# cross-check: the published modeling_phi4flash.py run in float64 on CPU
# ------------------------------------------------------------------------------------------------------------
def _published_stubs(torch, recorder):
    """Plain-torch stand-ins for the CUDA packages modeling_phi4flash.py imports, written from their documented
    semantics (flash-attn 2.x flash_attn_func; causal-conv1d causal_conv1d_fn / causal_conv1d_fwd; mamba_ssm
    selective_scan_ref). flash_attn_func also records its probability maps (recorder) for the map comparison."""
    import types
    F = torch.nn.functional

    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), **kw):
        # q [b, sq, hq, d], k/v [b, sk, hk, d]; GQA: q head h reads kv head h // (hq / hk); causal and window are
        # aligned to the bottom-right corner (flash-attn >= 2.1): key j visible to query i iff
        # j <= i + sk - sq (causal) and i + sk - sq - left <= j <= i + sk - sq + right (window, -1 = unbounded)
        b, sq, hq, d = q.shape
        sk, hk = k.shape[1], k.shape[2]
        scale = softmax_scale if softmax_scale is not None else d ** -0.5
        rep = hq // hk
        kk = k.repeat_interleave(rep, dim=2)
        vv = v.repeat_interleave(rep, dim=2)
        s = torch.einsum("bihd,bjhd->bhij", q, kk) * scale
        i = torch.arange(sq)[:, None] + (sk - sq)
        j = torch.arange(sk)[None, :]
        ok = torch.ones(sq, sk, dtype=torch.bool)
        left, right = window_size
        if causal:
            ok &= j <= i
        if left >= 0:
            ok &= j >= i - left
        if right >= 0:
            ok &= j <= i + right
        s = s.masked_fill(~ok, float("-inf"))
        pmap = torch.softmax(s, dim=-1)
        recorder.append(pmap.detach().clone())
        return torch.einsum("bhij,bjhd->bihd", pmap, vv)

    def flash_attn_varlen_func(*a, **kw):
        raise NotImplementedError("varlen path not used (no attention_mask)")

    def causal_conv1d_ref(x, weight, bias=None, activation=None):
        # x [b, d, l], weight [d, w]: out[c, t] = bias[c] + sum_k weight[c, k] x[c, t - (w - 1) + k]
        w = weight.shape[-1]
        out = F.conv1d(x, weight.unsqueeze(1), bias, padding=w - 1, groups=x.shape[1])[..., :x.shape[-1]]
        return F.silu(out) if activation in ("silu", "swish") else out

    def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                         final_states_out=None, activation=None):
        return causal_conv1d_ref(x, weight, bias, activation)

    def causal_conv1d_fwd(x, weight, bias, seq_idx, initial_states, final_states_out, silu_activation):
        return causal_conv1d_ref(x, weight, bias, "silu" if silu_activation else None)

    def selective_scan_fwd(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
        # mamba_ssm selective_scan_ref: u, delta [b, d, l]; A [d, n]; B, C [b, g=1, n, l]; D [d]; z [b, d, l]
        dtype_in = u.dtype
        u, delta = u.float() if u.dtype != torch.float64 else u, delta.to(torch.float64)
        if delta_bias is not None:
            delta = delta + delta_bias[..., None].to(delta.dtype)
        if delta_softplus:
            delta = F.softplus(delta)
        Bv = B[:, 0] if B.dim() == 4 else B
        Cv = C[:, 0] if C.dim() == 4 else C
        bsz, dim, L = u.shape
        x = u.new_zeros(bsz, dim, A.shape[1])
        deltaA = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))
        deltaB_u = torch.einsum("bdl,bnl,bdl->bdln", delta, Bv, u)
        ys = []
        for t in range(L):
            x = deltaA[:, :, t] * x + deltaB_u[:, :, t]
            ys.append(torch.einsum("bdn,bn->bd", x, Cv[:, :, t]))
        out = torch.stack(ys, dim=2)
        if D is not None:
            out = out + u * D[..., None]
        last = u.new_zeros(bsz, dim, 1, 2 * A.shape[1])
        last[:, :, -1, 1::2] = x
        out_z = out * F.silu(z) if z is not None else None
        return (out.to(dtype_in), last, out_z.to(dtype_in)) if z is not None else (out.to(dtype_in), last)

    def selective_state_update(*a, **kw):
        raise NotImplementedError("decode step not used")

    mods = {
        "flash_attn": types.SimpleNamespace(flash_attn_func=flash_attn_func,
                                            flash_attn_varlen_func=flash_attn_varlen_func),
        "flash_attn.bert_padding": types.SimpleNamespace(index_first_axis=None, pad_input=None, unpad_input=None),
        "causal_conv1d": types.SimpleNamespace(causal_conv1d_fn=causal_conv1d_fn, causal_conv1d_update=None),
        "causal_conv1d_cuda": types.SimpleNamespace(causal_conv1d_fwd=causal_conv1d_fwd),
        "mamba_ssm": types.SimpleNamespace(),
        "mamba_ssm.ops": types.SimpleNamespace(),
        "mamba_ssm.ops.triton": types.SimpleNamespace(),
        "mamba_ssm.ops.triton.selective_state_update":
            types.SimpleNamespace(selective_state_update=selective_state_update),
        "selective_scan_cuda": types.SimpleNamespace(fwd=selective_scan_fwd),
    }
    return mods


def load_published(src, torch, recorder):
    """Import SRC/modeling_phi4flash.py as package `phi4flash_published` with the stubs above. Two edits to the
    published code, both needed only because this runs on CPU in float64: the jiterator SwiGLU (CUDA-only) becomes
    its codestring in torch (float(x) * float(y) / (1 + exp(-float(x)))), and FlashDiffCustomAttention.forward loses
    its three q/k/v `.to(torch.bfloat16)` casts and its dtype/is_cuda asserts (the rest of its source runs as is)."""
    import importlib
    import inspect
    import tempfile
    import textwrap
    # transformers first, while the stub packages are not yet importable (it probes for flash_attn itself)
    import transformers
    import transformers.activations  # noqa: F401
    import transformers.cache_utils  # noqa: F401
    import transformers.generation  # noqa: F401
    import transformers.modeling_outputs  # noqa: F401
    import transformers.modeling_utils  # noqa: F401
    for name, mod in _published_stubs(torch, recorder).items():
        sys.modules[name] = mod
    torch.cuda.jiterator._create_jit_fn = lambda code, **kw: (lambda x, y: x * y * torch.sigmoid(x))
    torch.cuda.jiterator._create_multi_output_jit_fn = lambda code, num_outputs=1, **kw: None
    tmp = tempfile.mkdtemp(prefix="phi4flash_pub_")
    pkg = os.path.join(tmp, "phi4flash_published")
    os.makedirs(pkg)
    for f in ("modeling_phi4flash.py", "configuration_phi4flash.py"):
        shutil.copy(os.path.join(src, f), os.path.join(pkg, f))
    open(os.path.join(pkg, "__init__.py"), "w").close()
    sys.path.insert(0, tmp)
    mp = importlib.import_module("phi4flash_published.modeling_phi4flash")
    mp.is_flash_attn_greater_or_equal_2_10 = lambda: True  # only picks the flash-attn mask corner (unused here)
    if int(transformers.__version__.split(".")[0]) >= 5:  # the file targets 4.46 (list form); v5 wants a mapping
        mp.Phi4FlashForCausalLM._tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
        # SambaYCache (use_cache=True) keeps its own key/value lists; v5's Cache.__init__ insists on layer objects
        mp.Cache.__init__ = lambda self, *a, **kw: None
    cp = importlib.import_module("phi4flash_published.configuration_phi4flash")
    fsrc = textwrap.dedent(inspect.getsource(mp.FlashDiffCustomAttention.forward))
    drop = ("q = q.to(torch.bfloat16)", "k = k.to(torch.bfloat16)", "v = v.to(torch.bfloat16)",
            "assert q.dtype in", "assert q.is_cuda")
    lines = [ln for ln in fsrc.split("\n") if not any(ln.strip().startswith(x) for x in drop)]
    assert len(fsrc.split("\n")) - len(lines) == 5, "FlashDiffCustomAttention.forward changed shape"
    ns = {}
    exec("\n".join(lines), mp.__dict__, ns)
    mp.FlashDiffCustomAttention.forward = ns["forward"]
    return mp, cp


def crosscheck_published(src, folder, use_cache_modes=(False, True)):
    import torch
    torch.set_default_dtype(torch.float64)
    if not hasattr(crosscheck_published, "mods"):
        recorder = []
        crosscheck_published.mods = load_published(src, torch, recorder) + (recorder,)
    mp, cp, recorder = crosscheck_published.mods
    with open(os.path.join(folder, "config.json")) as f:
        cj = json.load(f)
    cj.pop("_attn_implementation", None)
    config = cp.Phi4FlashConfig(**cj)
    ref = pr.Phi4FlashModel.load(folder)
    c = ref.cfg
    model = mp.Phi4FlashForCausalLM(config).to(torch.float64).eval()
    sd = {k: torch.from_numpy(ref.ckpt.get(k)) for k in ref.ckpt.where}
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    exp = pr.SafetensorsFile(os.path.join(folder, "expected.safetensors"))
    ids = torch.from_numpy(exp.get("input_ids", np.int64))[None]
    mx = lambda a, key: float(np.max(np.abs(np.asarray(a, dtype=np.float64) - exp.get(key))))
    name = os.path.basename(folder)

    def restore_lambdas(saved):  # the published lambda vectors back after an override run
        for l, t in saved.items():
            m = model.model.layers[l].attn.inner_cross_attn
            with torch.no_grad():
                for p_, v_ in zip((m.lambda_q1, m.lambda_k1, m.lambda_q2, m.lambda_k2), t):
                    p_.copy_(v_)

    for use_cache in use_cache_modes:
        for run in ("", "override."):
            if run:  # force lambda_full = override t via the lambda vectors: q2 . k2 = log 2, q1 . k1 = log(t - li + 2)
                ov = exp.get("override.lambda")
                saved = {}
                for i, l in enumerate(c.diff_layers):
                    m = model.model.layers[l].attn.inner_cross_attn
                    saved[l] = [t.detach().clone() for t in (m.lambda_q1, m.lambda_k1, m.lambda_q2, m.lambda_k2)]
                    val = math.log(ov[i] - m.lambda_init + 2.0)
                    with torch.no_grad():
                        m.lambda_q1.zero_(); m.lambda_k1.zero_(); m.lambda_q2.zero_(); m.lambda_k2.zero_()
                        m.lambda_q1[0] = val; m.lambda_k1[0] = 1.0
                        m.lambda_q2[0] = math.log(2.0); m.lambda_k2[0] = 1.0
            recorder.clear()
            try:
                with torch.no_grad():
                    out = model(input_ids=ids, use_cache=use_cache, output_hidden_states=True, return_dict=True)
            except Exception as e:  # noqa: BLE001
                print(f"{name} published (use_cache={use_cache}) {run or 'plain'}: FAILED {type(e).__name__}: {e}")
                if run:
                    restore_lambdas(saved)
                continue
            res = {"logits": mx(out.logits[0].numpy(), run + "logits")}
            if not run and not use_cache:  # float64 against float64, before the F32 storage of expected
                r64 = ref.forward(ids[0].numpy())
                res["logits(f64 vs f64)"] = float(np.max(np.abs(out.logits[0].numpy() - r64["logits"])))
            if not run:
                hs = out.hidden_states  # inputs of each layer, then final_layernorm(last) (not comparable)
                res["hidden"] = max(mx(hs[l][0].numpy(), f"hidden.{l}") for l in range(c.layers))
            assert len(recorder) == 4 * len(c.diff_layers), len(recorder)
            dm = 0.0
            for i, l in enumerate(c.diff_layers):
                a1, a12, a2 = recorder[4 * i][0], recorder[4 * i + 1][0], recorder[4 * i + 2][0]
                assert torch.equal(a1, a12)
                dm = max(dm, mx(a1.numpy(), f"{run}layers.{l}.attn1"), mx(a2.numpy(), f"{run}layers.{l}.attn2"))
                if not run:
                    m = model.model.layers[l].attn.inner_cross_attn  # the published expression (M:2089-2091)
                    with torch.no_grad():
                        lam = float(torch.exp(torch.sum(m.lambda_q1 * m.lambda_k1)) - torch.exp(torch.sum(
                            m.lambda_q2 * m.lambda_k2)) + m.lambda_init)
                    res.setdefault("lambda", 0.0)
                    res["lambda"] = max(res["lambda"], abs(lam - float(exp.get(f"layers.{l}.lambda")[0])))
            res["maps"] = dm
            print(f"{name} published (use_cache={use_cache}) {run or 'plain'}: max |diff| vs expected: "
                  + ", ".join(f"{k} {v:.2e}" for k, v in res.items()))
            if run:
                restore_lambdas(saved)


def main():
    args = sys.argv[1:]
    cross_src = None
    if "--crosscheck" in args:
        i = args.index("--crosscheck")
        cross_src = args[i + 1]
        del args[i:i + 2]
    sens = "--sensitivity" in args
    args = [a for a in args if a != "--sensitivity"]
    out = args[0] if args else os.path.join(ROOT, "tests", "fixtures")
    made = [make(out, name, s) for name, s in FIXTURES.items()]
    if sens:
        for d, ids in made:
            sensitivity(d, ids)
    if cross_src:
        for d, ids in made:
            crosscheck_published(cross_src, d)


if __name__ == "__main__":
    main()
