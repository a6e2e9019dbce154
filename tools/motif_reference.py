#!/usr/bin/env python3
"""An independent float64 numpy reference of the Motif forward pass (MotifForCausalLM, model_type "motif"):
Motif-2.6B / Motif-2.6b-v1.1-LC (plain differential attention, DIFF V1 in every layer) and Motif-2-12.7B
(grouped differential attention, GDA: several signal heads share one noise head).

Written from the published Motif code (docs/models/motif.md quotes it line by line), not from diffscope's C++:
  - Motif's own vLLM fork, MotifTechnologies/vllm @477e4d79 (branch motif-v0.12.0):
    vllm/model_executor/models/motif.py (MotifAttention / MotifMLP / MotifDecoderLayer) and
    vllm/v1/attention/backends/grouped_diff_attn.py (GroupedDifferentialAttentionImpl.forward), PolyNorm in
    vllm/model_executor/layers/layernorm.py;
  - upstream vLLM @130dd6e8 vllm/model_executor/models/motif.py + vllm/attention/backends/differential_flash_attn.py
    ("Adapted from https://huggingface.co/Motif-Technologies/Motif-2.6B/blob/main/modeling_motif.py");
  - junhoyeo/mlx-motif src/mlx_motif/model.py @04fb0f8f (vanilla and grouped paths).
The Hugging Face remote-code file modeling_motif.py itself could not be read here (see docs/models/motif.md).

The math, per decoder layer l (0-based), x the residual stream [n, hidden]:
    h = RMSNorm(x; input_layernorm.weight, rms_norm_eps)
    q = h Wq^T [n, Hq, d], k = h Wk^T [n, Hkv, d], v = h Wv^T [n, Hkv, d]      (d = head_dim, default hidden/Hq)
    q, k = RoPE_neox(q), RoPE_neox(k)     rotate_half style, inv_freq = theta^(-2i/d), positions 0..n-1
    N = num_noise_heads (absent: Hq/2), G = Hq/N q heads per group, gr = G-1 signal heads per group, S = N*gr
    q head g*G + r (r < gr) is signal head i = g*gr + r; q head g*G + gr is the noise head of group g
    k1 = k heads 0,2,4..  k2 = k heads 1,3,5..  v1 = v heads 0,2,4..  v2 = v heads 1,3,5..   (P = Hkv/2 pairs)
    signal head i reads pair p = i // (S/P);  noise head g reads pair p = g // (N/P)   (flash-attention GQA)
    A1_i = softmax(q_i k1_p^T / sqrt(d) + causal),  A2_g = softmax(q_noise(g) k2_p^T / sqrt(d) + causal)
    O_i = A1_i [v1_p | v2_p] - lambda * A2_{i // gr} [v1_p' | v2_p']          ([n, 2d])
    O_i = RMSNorm(O_i; self_attn.subln.weight, attn_rms_norm_eps) * (1 - lambda_init(l))
    attn_out = concat_i O_i  Wo^T                                              (signal head i -> cols i*2d ..)
    lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init(l),
    lambda_init(l) = 0.8 - 0.6 exp(-0.3 (l - 1))                                (note the -1: layer 0 -> -0.0099)
    x = x + attn_out
    m = RMSNorm(x; post_attention_layernorm.weight, rms_norm_eps)
    x = x + down( PolyNorm(gate(m)) * up(m) )
    PolyNorm(z) = w0 N(z^3) + w1 N(z^2) + w2 N(z) + b,  N(u) = u / sqrt(mean(u^2) + 1e-6) over the last dim
logits = RMSNorm(x; model.norm.weight, rms_norm_eps) W_lm^T   (W_lm = embed_tokens when tie_word_embeddings)
Plain Motif-2.6B is the case N = Hq/2 (G = 2): differential head j = q heads (2j, 2j+1), i.e. interleaved pairs.

Maps returned per layer: attn1 [S, n, n] = A1 of signal head i; attn2 [S, n, n] = the noise map its group uses
(A2 of group i // gr, repeated for each signal head of the group). For plain Motif S = Hq/2 and attn2[j] is the map of
q head 2j+1.

Library:  m = MotifModel.load(DIR); out = m.forward(ids, lambda_override=None)
          expected_tensors(m, ids, override) -> the dict written as expected.safetensors by tests/gen_motif_fixtures.py
CLI:      tools/motif_reference.py DIR --ids 1,17,42 [--override 0,1.27,..] [--out expected.safetensors] [--top 5]
numpy only; safetensors files are parsed by hand (F64/F32/F16/BF16/I64/I32/I16/I8/U8/BOOL), single file or sharded
(model.safetensors.index.json), read lazily so only the tensors in use are held in float64.
"""
import argparse
import json
import math
import os
import sys
import warnings

import numpy as np

from safetensors_np import BF16, Checkpoint, SafetensorsFile, bf16_round, write_safetensors  # noqa: E402,F401

# ----------------------------------------------------------------------------------------------------------------
# config
# ----------------------------------------------------------------------------------------------------------------
def lambda_init_of(layer_idx):
    """Motif's depth schedule: 0.8 - 0.6 exp(-0.3 (layer_idx - 1)), layer_idx 0-based (vLLM lambda_init_fn)."""
    return 0.8 - 0.6 * math.exp(-0.3 * (layer_idx - 1))


class MotifConfig:
    def __init__(self, c):
        self.raw = c
        if c.get("hidden_act", "poly_norm") != "poly_norm":
            raise NotImplementedError(f"hidden_act {c.get('hidden_act')!r}: only 'poly_norm' (the published MLP)")
        self.hidden = int(c["hidden_size"])
        self.layers = int(c["num_hidden_layers"])
        self.inter = int(c["intermediate_size"])
        self.vocab = int(c["vocab_size"])
        self.hq = int(c["num_attention_heads"])
        self.hkv = int(c.get("num_key_value_heads") or self.hq)
        self.head_dim = int(c.get("head_dim") or self.hidden // self.hq)
        self.noise = c.get("num_noise_heads")
        self.grouped = self.noise is not None
        self.noise = int(self.noise) if self.grouped else self.hq // 2
        if int(c.get("k_ratio", 1)) != 1:
            raise NotImplementedError("k_ratio != 1 (no published checkpoint uses it; Motif's vLLM fork assumes 1)")
        self.rms_eps = float(c.get("rms_norm_eps", 1e-6))
        self.attn_eps = float(c.get("attn_rms_norm_eps", 1e-5))
        rp = c.get("rope_parameters") or {}
        self.theta = float(c.get("rope_theta", rp.get("rope_theta", 10000.0)))
        rs = c.get("rope_scaling") or {}
        rtype = rs.get("rope_type", rs.get("type", rp.get("rope_type", "default")))
        if rtype not in (None, "default"):
            raise NotImplementedError(f"rope scaling {rtype!r} is not implemented in this reference")
        self.tie = c.get("tie_word_embeddings")  # None: decided by the presence of lm_head.weight
        # topology checks (Motif's vLLM fork GroupedDifferentialAttentionImpl.__init__ asserts the same)
        hq, n, hkv = self.hq, self.noise, self.hkv
        if hq % n or hq // n < 2:
            raise ValueError(f"num_attention_heads {hq} must be a multiple >= 2 of the noise heads {n}")
        self.group = hq // n
        self.gr = self.group - 1
        self.signal = n * self.gr
        if hkv % 2:
            raise ValueError("num_key_value_heads must be even (k1/k2 and v1/v2 are its even/odd heads)")
        self.pairs = hkv // 2
        if self.signal % self.pairs or n % self.pairs:
            raise ValueError(f"signal heads {self.signal} and noise heads {n} must be multiples of Hkv/2 = {self.pairs}")
        if not self.grouped and hq % hkv:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")

    def signal_pair(self, i):
        return i // (self.signal // self.pairs)

    def noise_pair(self, g):
        return g // (self.noise // self.pairs)

    def inv_freq(self):
        d = self.head_dim
        return 1.0 / (self.theta ** (np.arange(0, d, 2, dtype=np.float64) / d))


# ----------------------------------------------------------------------------------------------------------------
# forward
# ----------------------------------------------------------------------------------------------------------------
def rms_norm(x, w, eps):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * w if w is not None else y


def poly_norm(z, w, b, eps=1e-6):
    def nrm(u):
        return u / np.sqrt(np.mean(u * u, axis=-1, keepdims=True) + eps)
    return w[0] * nrm(z ** 3) + w[1] * nrm(z ** 2) + w[2] * nrm(z) + b[0]


def rope_neox(x, cos, sin):
    """x [n, heads, d]; rotate_half: pairs (i, i + d/2)."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def softmax_causal(scores):
    """scores [..., n, n] -> row softmax with keys j > i masked."""
    n = scores.shape[-1]
    s = np.where(np.tril(np.ones((n, n), dtype=bool)), scores, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def linear(x, w, b=None):
    y = x @ w.T
    return y + b if b is not None else y


class MotifModel:
    """bf16=True emulates a bf16 engine on top of the float64 math: the projection and embedding matrices rounded to
    bf16, every projection's input rounded to bf16 (the normed rows, the attention output, the MLP activation), q, k
    (after RoPE), v, gate and up rounded to bf16, while o_proj / down_proj outputs join the residual stream unrounded
    and norms, softmax and lambda stay float64. It is the reference for a GPU backend's bf16 tolerance: with
    strongly perturbed weights, bf16 rounding alone moves maps by more than that tolerance from the float64 result."""

    def __init__(self, cfg, ckpt, bf16=False):
        self.cfg = cfg
        self.ckpt = ckpt
        self.bf16 = bf16

    def _r(self, a):
        return bf16_round(a).astype(np.float64) if self.bf16 else a

    def _w(self, name):
        return self._r(self.ckpt.get(name))

    def _lin(self, x, wname, bname=None, round_out=False):
        y = linear(self._r(x), self._w(wname), self.ckpt.opt(bname) if bname else None)
        return self._r(y) if round_out else y

    @classmethod
    def load(cls, folder):
        with open(os.path.join(folder, "config.json")) as f:
            cfg = MotifConfig(json.load(f))
        return cls(cfg, Checkpoint(folder))

    def layer_lambda(self, l):
        p = f"model.layers.{l}.self_attn."
        g = self.ckpt.get
        l1 = math.exp(float(np.sum(g(p + "lambda_q1") * g(p + "lambda_k1"))))
        l2 = math.exp(float(np.sum(g(p + "lambda_q2") * g(p + "lambda_k2"))))
        return l1 - l2 + lambda_init_of(l)

    def lm_head(self):
        c, ck = self.cfg, self.ckpt
        if c.tie is True or (c.tie is None and "lm_head.weight" not in ck):
            return self._w("model.embed_tokens.weight")
        return self._w("lm_head.weight")

    def attention(self, l, h, cos, sin, lam):
        c, ck = self.cfg, self.ckpt
        p = f"model.layers.{l}.self_attn."
        n, d = h.shape[0], c.head_dim
        q = self._lin(h, p + "q_proj.weight", p + "q_proj.bias", True).reshape(n, c.hq, d)
        k = self._lin(h, p + "k_proj.weight", p + "k_proj.bias", True).reshape(n, c.hkv, d)
        v = self._lin(h, p + "v_proj.weight", p + "v_proj.bias", True).reshape(n, c.hkv, d)
        q, k = self._r(rope_neox(q, cos, sin)), self._r(rope_neox(k, cos, sin))
        k1, k2, v1, v2 = k[:, 0::2], k[:, 1::2], v[:, 0::2], v[:, 1::2]
        scale = 1.0 / math.sqrt(d)
        # noise heads: q head g*G + gr
        a2, o2 = [], []
        for g in range(c.noise):
            pp = c.noise_pair(g)
            a = softmax_causal((q[:, g * c.group + c.gr] @ k2[:, pp].T) * scale)
            a2.append(a)
            o2.append(a @ np.concatenate([v1[:, pp], v2[:, pp]], axis=-1))
        attn1, attn2, outs = [], [], []
        w_sub = ck.opt(p + "subln.weight")
        if w_sub is None:
            warnings.warn(f"{p}subln.weight missing: using 1 (the published RMSNorm's init)")
        li = lambda_init_of(l)
        for i in range(c.signal):
            g, r = divmod(i, c.gr)
            pp = c.signal_pair(i)
            a = softmax_causal((q[:, g * c.group + r] @ k1[:, pp].T) * scale)
            o1 = a @ np.concatenate([v1[:, pp], v2[:, pp]], axis=-1)
            o = rms_norm(o1 - lam * o2[g], w_sub, c.attn_eps) * (1.0 - li)
            attn1.append(a)
            attn2.append(a2[g])
            outs.append(o)
        out = self._lin(np.concatenate(outs, axis=-1), p + "o_proj.weight", p + "o_proj.bias")
        return out, np.stack(attn1), np.stack(attn2)

    def mlp(self, l, x):
        ck = self.ckpt
        p = f"model.layers.{l}.mlp."
        gate = self._lin(x, p + "gate_proj.weight", p + "gate_proj.bias", True)
        up = self._lin(x, p + "up_proj.weight", p + "up_proj.bias", True)
        w, b = ck.opt(p + "act_fn.weight"), ck.opt(p + "act_fn.bias")
        if w is None or b is None:
            warnings.warn(f"{p}act_fn.weight/bias missing: using PolyNorm's init (1/3, 1/3, 1/3; 0)")
            w = np.full(3, 1.0 / 3.0) if w is None else w
            b = np.zeros(1) if b is None else b
        return self._lin(poly_norm(gate, w, b) * up, p + "down_proj.weight", p + "down_proj.bias")

    def forward(self, ids, lambda_override=None, want_maps=True):
        """ids: sequence of token ids (positions 0..n-1). lambda_override: None or one value per layer, used as
        lambda_full in place of exp(.)-exp(.)+lambda_init (lambda_init still scales the output by 1-lambda_init).
        Returns dict: logits [n,V], hidden list of L+1 [n,hidden] (input of each layer, then the last layer's
        output before the final norm), attn1/attn2 lists of [S,n,n], lambda list, lambda_init list, inv_freq."""
        c, ck = self.cfg, self.ckpt
        ids = np.asarray(ids, dtype=np.int64)
        n = ids.shape[0]
        x = self._w("model.embed_tokens.weight")[ids]
        inv = c.inv_freq()
        ang = np.arange(n, dtype=np.float64)[:, None] * inv[None, :]
        cos, sin = np.cos(ang), np.sin(ang)
        hidden, attn1, attn2, lams = [], [], [], []
        for l in range(c.layers):
            hidden.append(x.copy())
            lam = self.layer_lambda(l) if lambda_override is None else float(lambda_override[l])
            lams.append(lam)
            pre = f"model.layers.{l}."
            h = rms_norm(x, ck.get(pre + "input_layernorm.weight"), c.rms_eps)
            a, m1, m2 = self.attention(l, h, cos, sin, lam)
            x = x + a
            h = rms_norm(x, ck.get(pre + "post_attention_layernorm.weight"), c.rms_eps)
            x = x + self.mlp(l, h)
            if want_maps:
                attn1.append(m1)
                attn2.append(m2)
        hidden.append(x.copy())
        logits = self._r(rms_norm(x, ck.get("model.norm.weight"), c.rms_eps)) @ self.lm_head().T
        return {"logits": logits, "hidden": hidden, "attn1": attn1, "attn2": attn2, "lambda": lams,
                "lambda_init": [lambda_init_of(l) for l in range(c.layers)], "inv_freq": inv}


def default_override(layers):
    """The forced lambda values tests/gen_fixtures.py uses for DiffLlama: 0 (plain attention) in layer 0."""
    return [0.0 if l == 0 else 0.9 + 0.37 * l for l in range(layers)]


def expected_tensors(model, ids, override=None):
    """The expected.safetensors dict (float64 computed, stored F32; input_ids I64), format of tests/gen_fixtures.py."""
    L = model.cfg.layers
    override = default_override(L) if override is None else list(override)
    f32 = lambda a: np.ascontiguousarray(np.asarray(a, dtype=np.float64).astype(np.float32))
    out = {"input_ids": np.asarray(ids, dtype=np.int64)}
    r = model.forward(ids)
    out["rope.inv_freq"] = f32(r["inv_freq"])
    out["logits"] = f32(r["logits"])
    for l in range(L + 1):
        out[f"hidden.{l}"] = f32(r["hidden"][l])
    for l in range(L):
        out[f"layers.{l}.attn1"] = f32(r["attn1"][l])
        out[f"layers.{l}.attn2"] = f32(r["attn2"][l])
    for l in range(L):
        out[f"layers.{l}.lambda"] = f32([r["lambda"][l]])
    o = model.forward(ids, lambda_override=override)
    out["override.lambda"] = f32(override)
    out["override.logits"] = f32(o["logits"])
    for l in range(L):
        out[f"override.layers.{l}.attn1"] = f32(o["attn1"][l])
        out[f"override.layers.{l}.attn2"] = f32(o["attn2"][l])
    # The same runs as a bf16 engine computes them (MotifModel's bf16 emulation): "bf16."-prefixed keys.
    e = MotifModel(model.cfg, model.ckpt, bf16=True)
    rb, ob = e.forward(ids), e.forward(ids, lambda_override=override)
    out["bf16.logits"] = f32(rb["logits"])
    for l in range(L + 1):
        out[f"bf16.hidden.{l}"] = f32(rb["hidden"][l])
    for l in range(L):
        out[f"bf16.layers.{l}.attn1"] = f32(rb["attn1"][l])
        out[f"bf16.layers.{l}.attn2"] = f32(rb["attn2"][l])
    out["bf16.override.logits"] = f32(ob["logits"])
    for l in range(L):
        out[f"bf16.override.layers.{l}.attn1"] = f32(ob["attn1"][l])
        out[f"bf16.override.layers.{l}.attn2"] = f32(ob["attn2"][l])
    return out, r, o


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--ids", required=True, help="comma-separated token ids")
    ap.add_argument("--override", help="comma-separated lambda per layer for the override run")
    ap.add_argument("--out", help="write expected.safetensors-format tensors here")
    ap.add_argument("--top", type=int, default=5)
    a = ap.parse_args()
    m = MotifModel.load(a.model_dir)
    ids = [int(t) for t in a.ids.split(",") if t.strip()]
    ov = [float(t) for t in a.override.split(",")] if a.override else None
    c = m.cfg
    print(f"motif: hidden {c.hidden}, {c.layers} layers, q heads {c.hq} ({c.signal} signal + {c.noise} noise, "
          f"{'grouped' if c.grouped else 'plain'}), kv heads {c.hkv}, head_dim {c.head_dim}, vocab {c.vocab}")
    if a.out:
        t, r, _ = expected_tensors(m, ids, ov)
        write_safetensors(a.out, t, {"generator": "tools/motif_reference.py"})
    else:
        r = m.forward(ids, lambda_override=ov)
    for l, (lam, li) in enumerate(zip(r["lambda"], r["lambda_init"])):
        print(f"layer {l}: lambda {lam:+.6f} (lambda_init {li:+.6f})")
    last = r["logits"][-1]
    top = np.argsort(-last)[: a.top]
    print("next token:", ", ".join(f"{int(i)} ({last[i]:.4f})" for i in top))


if __name__ == "__main__":
    sys.exit(main())
