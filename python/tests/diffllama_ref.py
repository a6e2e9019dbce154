"""A float64 DiffLlama forward written from the published math (Ye et al. 2024; transformers' DiffLlama layout), with
the interventions diffscope's engine builds into its one forward, for the tests to hold the engine against:
  head_coef {(layer, view head j): (c1, c2)}: head j's output before its sub-layer norm is c1 A1 V - c2 A2 V
      (the layer's (1, lambda) otherwise): drop A1 is c1 = 0, drop A2 is c2 = 0, a head's own lambda is c2;
  knockout {layer: [(q0, q1, k0, k1), ...]}: queries [q0, q1) do not see keys [k0, k1) in either map (a row with
      no key left contributes 0);
  head_scale {(layer, j): factor}: the head's output after its norm and (1 - lambda_init) times factor.
It reads the checkpoint with conftest's safetensors reader and covers the f32 fixtures with the default RoPE; it is
itself checked against transformers' logits in expected.safetensors (test_reference_matches_transformers)."""
import json
import math

import numpy as np

from conftest import read_safetensors


def load(folder):
    cfg = json.loads((folder / "config.json").read_text())
    w = {}
    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    for f in files:
        w.update({k: v.astype(np.float64) for k, v in read_safetensors(folder / f).items()})
    return cfg, w


def rms(x, weight, eps):
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y * weight if weight is not None else y


def rope(x, pos, theta):
    d = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.outer(pos, inv)  # [n, d/2]
    cos = np.concatenate([np.cos(ang)] * 2, -1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, -1)[:, None, :]
    rot = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * cos + rot * sin


def softmax_rows(s, allowed):
    s = np.where(allowed, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(allowed, np.exp(s - m), 0.0)
    z = e.sum(-1, keepdims=True)
    return np.divide(e, z, out=np.zeros_like(e), where=z > 0)


def forward(folder, ids, lambdas=None, head_coef=None, knockout=None, head_scale=None, scores=None, head_mean=None,
            logit_bits=0):
    """Returns (logits [n, vocab], hidden [L + 1][n, E] (layer inputs, then the last output), maps {l: (a1, a2)}).
    scores: a dict to fill with each layer's attention logits q.k / sqrt(d) [H, n, n] (before any mask).
    head_mean {(layer, j): n0}: the head's output (after its norm) at every position replaced by its mean over
    positions 0 .. n0 - 1 (the prompt's, for a decoding step's check).
    logit_bits: every logit fake-quantised before the softmax, symmetric absmax per query row and head over the keys
    the row sees: step = amax / (2^(bits-1) - 1), rint(s / step) * step, in float32 as the engines compute it."""
    cfg, w = load(folder)
    head_coef, knockout, head_scale = head_coef or {}, knockout or {}, head_scale or {}
    L, H, Hkv, d = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    theta = cfg["rope_theta"] if "rope_theta" in cfg else cfg["rope_parameters"]["rope_theta"]  # transformers v4 / v5
    n, Hv = len(ids), H // 2
    x = w["model.embed_tokens.weight"][np.asarray(ids)]
    hidden, maps = [x.copy()], {}
    pos = np.arange(n)
    causal = pos[None, :] <= pos[:, None]
    for l in range(L):
        p = f"model.layers.{l}."
        h = rms(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(n, H, d)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(n, Hkv, d)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(n, Hkv, d)
        q, k = rope(q, pos, theta), rope(k, pos, theta)
        rep = H // Hkv
        k = np.repeat(k, rep, axis=1)
        v = np.repeat(v, rep, axis=1)
        lam_init = 0.8 - 0.6 * math.exp(-0.3 * l)
        if lambdas is not None:
            lam = lambdas[l]
        else:
            lam = (math.exp(float(np.dot(w[p + "self_attn.lambda_q1"], w[p + "self_attn.lambda_k1"])))
                   - math.exp(float(np.dot(w[p + "self_attn.lambda_q2"], w[p + "self_attn.lambda_k2"]))) + lam_init)
        allowed = np.broadcast_to(causal, (n, n)).copy()
        for (q0, q1, k0, k1) in knockout.get(l, []):
            allowed[q0:q1, k0:k1] = False
        s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
        if scores is not None:
            scores[l] = s
        if logit_bits:
            s32 = s.astype(np.float32)
            amax = np.where(allowed[None], np.abs(s32), np.float32(0)).max(-1, keepdims=True)
            step = (amax / np.float32((1 << (logit_bits - 1)) - 1)).astype(np.float32)
            safe = np.where(step > 0, step, np.float32(1))
            q = (np.rint(s32 / safe) * safe).astype(np.float32)
            s = np.where(step > 0, q, s32).astype(np.float64)
        a = softmax_rows(s, allowed[None])
        a1, a2 = a[:Hv], a[Hv:]
        maps[l] = (a1, a2)
        vv = np.concatenate([v[:, :Hv], v[:, Hv:]], -1)  # [n, Hv, 2d]: view head j's V = [v_j | v_{j + Hv}]
        o1 = np.einsum("hqk,khe->hqe", a1, vv)
        o2 = np.einsum("hqk,khe->hqe", a2, vv)
        out = np.empty((Hv, n, 2 * d))
        for j in range(Hv):
            c1, c2 = head_coef.get((l, j), (1.0, lam))
            out[j] = c1 * o1[j] - c2 * o2[j]
        out = (1 - lam_init) * rms(out, None, eps)
        for j in range(Hv):
            out[j] *= head_scale.get((l, j), 1.0)
            if (l, j) in (head_mean or {}):
                out[j][:] = out[j][:head_mean[(l, j)]].mean(0)
        attn = out.transpose(1, 0, 2).reshape(n, Hv * 2 * d)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"], eps)
        g = h @ w[p + "mlp.gate_proj.weight"].T
        u = h @ w[p + "mlp.up_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * u) @ w[p + "mlp.down_proj.weight"].T
        hidden.append(x.copy())
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    logits = rms(x, w["model.norm.weight"], eps) @ head.T
    return logits, hidden, maps


def lens(folder, hidden, positions):
    """The logit lens of the reference: each layer's output (hidden[l + 1]) through the final norm and the LM head,
    as log-probabilities [L][len(positions), vocab]."""
    cfg, w = load(folder)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    out = []
    for h in hidden[1:]:
        z = rms(h[positions], w["model.norm.weight"], cfg["rms_norm_eps"]) @ head.T
        z = z - z.max(-1, keepdims=True)
        out.append(z - np.log(np.exp(z).sum(-1, keepdims=True)))
    return out
