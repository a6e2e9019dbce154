#!/usr/bin/env python3
"""Evaluate the diffscope demo models: retrieval accuracy and attention to the answer.

    python3 tools/eval_demo.py --out OUT/demo        # reads OUT/demo/{diffllama-demo,llama-demo,eval_prompts.jsonl}
                                                     # and OUT/demo/eval_long_prompts.jsonl when it is there

Also called by tools/train_demo.py at the end of training. Writes OUT/eval.json and prints a table.

For every held-out prompt (a key-value lookup or a needle-in-a-haystack question, see
tools/demo_data.py) the models run once, eager attention, fp32, output_attentions=True, on
prompt + answer tokens:

* accuracy: the greedy next token at every answer position equals the answer token (so greedy
  decoding would produce the answer exactly);
* attention: the row of the query position (the prompt's last token), for every layer and head.
  For the DiffLlama, transformers returns [B, H, n, n] post-softmax maps with A1 of differential
  head j at index j and A2 at j + H/2; the map is the difference A1 - lambda_l * A2 with
  lambda_l = exp(lq1.lk1) - exp(lq2.lk2) + lambda_init(l), lambda_init(l) = 0.8 - 0.6 exp(-0.3 l).
  For the Llama twin it is the softmax map of each of its H heads.
  Regions of the row: `answer` = the tokens of the answer inside the context, `noise` = the rest of
  the context (excluding <|bos|> and the question/query segment), `bos`, `question`.
  Normalisations (all reported; `l1` is the headline):
    l1   : row / sum(|row|)  -- a softmax row is unchanged; a difference row gets total weight 1
    sum1 : row / sum(row)    -- the difference row sums to 1 - lambda; dividing makes it sum to 1
                                (layers with |1 - lambda| < 0.05 are skipped)
    raw  : the row as is
  Per prompt the region masses are averaged over heads and layers (as the paper's Fig. 1 / Table 3),
  then over prompts. Per-layer means are in eval.json too.
Long context: the same accuracy and attention on multi-needle prompts of tools/make_needle_set.py (several
lengths up to the long training length, the queried needle at several depths, near-miss distractors and other
needles in the haystack; eval_long_prompts.jsonl, kind "long"), by length, depth, length x depth and haystack.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

try:
    from transformers.utils import logging as _hf_logging
    _hf_logging.disable_progress_bar()
except Exception:  # noqa: BLE001
    pass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

NAMES = {"diff": "diffllama-demo", "llama": "llama-demo"}


def lambda_init(l: int) -> float:
    return 0.8 - 0.6 * math.exp(-0.3 * l)


def diff_lambdas(model) -> list[float]:
    out = []
    for l, layer in enumerate(model.model.layers):
        a = layer.self_attn
        l1 = torch.exp(torch.sum(a.lambda_q1.float() * a.lambda_k1.float()))
        l2 = torch.exp(torch.sum(a.lambda_q2.float() * a.lambda_k2.float()))
        out.append(float(l1 - l2 + lambda_init(l)))
    return out


@torch.no_grad()
def check_head_mapping(model, ids, device, layer=-1):
    """Rebuilds one DiffLlama attention layer's output from the returned maps, assuming A1 of
    differential head j at index j, A2 at j + H/2, K1 = kv head g = j // n_rep, K2 = kv head
    Hkv/2 + g, V = [v_g ; v_(Hkv/2+g)]. Returns the max abs error against the module's output."""
    cfg = model.config
    H, Hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    att = model.model.layers[layer].self_attn
    cap = {}

    def hook(mod, args, kwargs, out):
        cap["h"], cap["out"] = kwargs["hidden_states"], out[0]

    handle = att.register_forward_hook(hook, with_kwargs=True)
    out = model(input_ids=torch.tensor([ids], device=device), output_attentions=True, use_cache=False)
    handle.remove()
    A = out.attentions[layer][0].float()
    h = cap["h"][0]
    n = h.shape[0]
    v = att.v_proj(h).view(n, Hkv, d).transpose(0, 1)
    lam = diff_lambdas(model)[layer % cfg.num_hidden_layers]
    heads = []
    for j in range(H // 2):
        g = j // (H // Hkv)
        V = torch.cat([v[g], v[Hkv // 2 + g]], -1)
        heads.append(att.groupnorm((A[j] - lam * A[j + H // 2]) @ V) * (1 - att.lambda_init))
    ref = att.o_proj(torch.cat(heads, -1))
    return float((ref - cap["out"][0]).abs().max())


def load_prompts(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def regions(tok, p):
    """Token ids of prompt (with BOS) and answer, and boolean region masks over the prompt tokens."""
    enc = tok.encode(p["prompt"])
    ans = tok.encode(p["answer"], add_special_tokens=False).ids
    n = len(enc.ids)
    s, e = p["span"]
    qs = p["question_start"]
    answer = [False] * n
    noise = [False] * n
    question = [False] * n
    bos = [False] * n
    for i, ((a, b), special) in enumerate(zip(enc.offsets, enc.special_tokens_mask)):
        if special:
            bos[i] = True
            continue
        if a >= qs:
            question[i] = True
        elif a < e and b > s:
            answer[i] = True
        else:
            noise[i] = True
    return enc.ids, ans, {"answer": answer, "noise": noise, "bos": bos, "question": question}


KEYS = ("answer", "noise", "bos", "question")
NORMS = ("l1", "sum1", "raw")


@torch.no_grad()
def score_prompt(model, tok, p, device, is_diff, lam):
    """One prompt: (greedy answer correct, {norm: {region: mass}} averaged over heads and valid layers,
    {norm: {region: [L] per-layer mass}}, {norm: [L] layer valid})."""
    H = model.config.num_attention_heads
    L = model.config.num_hidden_layers
    ids, ans, reg = regions(tok, p)
    n = len(ids)
    x = torch.tensor([ids + ans], device=device)
    out = model(input_ids=x, output_attentions=True, use_cache=False)
    pred = out.logits[0, n - 1:n - 1 + len(ans)].argmax(-1).tolist()
    ok = pred == ans
    # rows of the query position over the prompt tokens: [L, H, n]
    rows = torch.stack([a[0, :, n - 1, :n].float() for a in out.attentions])
    del out
    r = rows[:, : H // 2] - lam[:, None, None] * rows[:, H // 2:] if is_diff else rows
    masks = {k: torch.tensor(v, device=device, dtype=torch.float32) for k, v in reg.items()}
    res, layers, valids = {}, {}, {}
    for nm in NORMS:
        if nm == "l1":
            rn = r / r.abs().sum(-1, keepdim=True).clamp_min(1e-12)
            valid = torch.ones(L, dtype=torch.bool, device=device)
        elif nm == "sum1":
            tot = r.sum(-1, keepdim=True)
            valid = tot.abs().amin(dim=(1, 2)) >= 0.05
            rn = r / torch.where(tot.abs() < 1e-6, torch.ones_like(tot), tot)
        else:
            rn = r
            valid = torch.ones(L, dtype=torch.bool, device=device)
        per_layer = {k: (rn * masks[k]).sum(-1).mean(-1) for k in KEYS}   # [L]
        v = valid.float()
        res[nm] = {k: float((per_layer[k] * v).sum() / v.sum().clamp_min(1)) for k in KEYS}
        layers[nm] = {k: (per_layer[k] * v).double().cpu() for k in KEYS}
        valids[nm] = v.double().cpu()
    return ok, res, layers, valids


def _group(scores):
    """Mean accuracy and region masses of a list of (ok, res) pairs."""
    n = len(scores)
    g = {"n": n, "accuracy": sum(ok for ok, _ in scores) / max(1, n)}
    by = {nm: {k: sum(r[nm][k] for _, r in scores) / max(1, n) for k in KEYS} for nm in NORMS}
    g.update({f"attn_{k}": by["l1"][k] for k in KEYS})
    g["by_norm"] = by
    return g


@torch.no_grad()
def eval_model(kind, model_dir, prompts, device, log=print, long_prompts=()):
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager",
                                                 dtype=torch.float32).to(device).eval()
    is_diff = model.config.model_type == "diffllama"
    L = model.config.num_hidden_layers
    lam = torch.tensor(diff_lambdas(model), device=device) if is_diff else None
    layer_sum = {nm: {k: torch.zeros(L, dtype=torch.float64) for k in KEYS} for nm in NORMS}
    layer_cnt = {nm: torch.zeros(L, dtype=torch.float64) for nm in NORMS}
    per_kind: dict = {}
    for p in prompts:
        ok, res, layers, valids = score_prompt(model, tok, p, device, is_diff, lam)
        per_kind.setdefault(p["kind"], []).append((ok, res))
        for nm in NORMS:
            for k in KEYS:
                layer_sum[nm][k] += layers[nm][k]
            layer_cnt[nm] += valids[nm]

    result = {"model_dir": os.path.basename(model_dir.rstrip("/")), "model_type": model.config.model_type}
    if is_diff:
        result["lambda"] = [round(float(v), 4) for v in lam.tolist()]
        err = check_head_mapping(model, regions(tok, prompts[0])[0], device)
        result["head_mapping_max_abs_err"] = err
        log(f"  head-mapping check (last layer rebuilt from the returned maps): max abs err {err:.2e}")
    for kind_name, sc in per_kind.items():
        g = _group(sc)
        result[kind_name] = {k: v for k, v in g.items()}
    result["all"] = _group([x for sc in per_kind.values() for x in sc])
    result["per_layer"] = {nm: {k: (layer_sum[nm][k] / layer_cnt[nm].clamp_min(1)).tolist() for k in KEYS}
                           for nm in NORMS}
    if long_prompts:
        scored = []
        for p in long_prompts:
            ok, res, _, _ = score_prompt(model, tok, p, device, is_diff, lam)
            scored.append((p, ok, res))

        def by(key):
            groups: dict = {}
            for p, ok, res in scored:
                groups.setdefault(key(p), []).append((ok, res))
            return {str(k): _group(v) for k, v in sorted(groups.items())}

        lg = _group([(ok, res) for _, ok, res in scored])
        lg["by_length"] = by(lambda p: p["length"])
        lg["by_depth"] = by(lambda p: p["depth"])
        lg["by_haystack"] = by(lambda p: p.get("haystack", ""))
        lg["by_length_depth"] = {k: {"n": v["n"], "accuracy": v["accuracy"]}
                                 for k, v in by(lambda p: f"{p['length']}@{p['depth']:g}").items()}
        result["long"] = lg
    del model
    return result


def print_table(res, log=print):
    log("")
    log(f"{'model':16s} {'acc kv':>7s} {'acc ndl':>7s} {'acc all':>7s} | {'answer':>7s} {'noise':>7s} "
        f"{'bos':>7s} {'question':>8s}   (attention of the query token, l1-normalised, mean of heads+layers)")
    for kind in ("diff", "llama"):
        r = res["models"].get(kind)
        if not r:
            continue
        a = r["all"]
        log(f"{NAMES[kind]:16s} {r.get('kv', {}).get('accuracy', float('nan')):7.3f} "
            f"{r.get('needle', {}).get('accuracy', float('nan')):7.3f} {a['accuracy']:7.3f} | "
            f"{a['attn_answer']:7.3f} {a['attn_noise']:7.3f} {a['attn_bos']:7.3f} {a['attn_question']:8.3f}")
    for kind in ("diff", "llama"):
        r = res["models"].get(kind)
        if r:
            bn = r["all"]["by_norm"]
            log(f"  {NAMES[kind]:16s} answer/noise raw {bn['raw']['answer']:.3f}/{bn['raw']['noise']:.3f}   "
                f"row-sum-normalised {bn['sum1']['answer']:.3f}/{bn['sum1']['noise']:.3f}")
    if "diff" in res["models"] and "llama" in res["models"]:
        da, la = res["models"]["diff"]["all"]["attn_answer"], res["models"]["llama"]["all"]["attn_answer"]
        dn, ln = res["models"]["diff"]["all"]["attn_noise"], res["models"]["llama"]["all"]["attn_noise"]
        log(f"attention to answer, diff / llama = {da / max(la, 1e-9):.2f}x ; "
            f"noise diff / llama = {dn / max(ln, 1e-9):.2f}x")
        last = {k: res["models"][k]["per_layer"]["l1"]["answer"] for k in ("diff", "llama")}
        log("per-layer attention to answer: diff " + " ".join(f"{v:.3f}" for v in last["diff"])
            + " | llama " + " ".join(f"{v:.3f}" for v in last["llama"]))
    log("")
    if any("long" in r for r in res["models"].values()):
        print_long_table(res, log)


def print_long_table(res, log=print):
    models = [k for k in ("diff", "llama") if "long" in res["models"].get(k, {})]
    first = res["models"][models[0]]["long"]
    lengths, depths = list(first["by_length"]), list(first["by_depth"])
    log(f"long context ({first['n']} prompts of tools/make_needle_set.py): accuracy by length and depth, "
        f"attention of the query token to answer / noise (row-sum-normalised)")
    log(f"{'model':16s} " + " ".join(f"{'L=' + l:>7s}" for l in lengths) + " | "
        + " ".join(f"{'d=' + d:>6s}" for d in depths) + " |   all | answer  noise")
    for k in models:
        lg = res["models"][k]["long"]
        s1 = lg["by_norm"]["sum1"]
        log(f"{NAMES[k]:16s} " + " ".join(f"{lg['by_length'][l]['accuracy']:7.3f}" for l in lengths) + " | "
            + " ".join(f"{lg['by_depth'][d]['accuracy']:6.3f}" for d in depths)
            + f" | {lg['accuracy']:5.3f} | {s1['answer']:6.3f} {s1['noise']:6.3f}")
    for k in models:
        lg = res["models"][k]["long"]
        log(f"  {NAMES[k]:16s} by length, answer/noise (row-sum-normalised): " + "  ".join(
            f"{l}: {v['by_norm']['sum1']['answer']:.3f}/{v['by_norm']['sum1']['noise']:.3f}"
            for l, v in lg["by_length"].items())
            + "   by haystack: " + "  ".join(f"{h}: {v['accuracy']:.3f}" for h, v in lg["by_haystack"].items()))
    log("")


def run_eval(out_dir, device=None, prompts_path=None, log=print, long_path=None):
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    prompts_path = prompts_path or os.path.join(out_dir, "eval_prompts.jsonl")
    prompts = load_prompts(prompts_path)
    long_path = long_path or os.path.join(out_dir, "eval_long_prompts.jsonl")
    long_prompts = load_prompts(long_path) if os.path.isfile(long_path) else []
    res = {"n_prompts": len(prompts), "prompts_file": os.path.basename(prompts_path),
           "n_long_prompts": len(long_prompts), "long_prompts_file": os.path.basename(long_path),
           "method": __doc__.split("\n\n", 2)[2].strip(), "models": {}}
    for kind in ("diff", "llama"):
        d = os.path.join(out_dir, NAMES[kind])
        if os.path.isdir(d):
            log(f"evaluating {NAMES[kind]} on {len(prompts)} prompts and {len(long_prompts)} long ones ...")
            res["models"][kind] = eval_model(kind, d, prompts, torch.device(device), log, long_prompts)
    with open(os.path.join(out_dir, "eval.json"), "w") as f:
        json.dump(res, f, indent=2)
    print_table(res, log)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder holding diffllama-demo/ and llama-demo/")
    ap.add_argument("--prompts", default=None, help="jsonl of prompts (default OUT/eval_prompts.jsonl)")
    ap.add_argument("--long-prompts", default=None,
                    help="jsonl of long-context prompts (default OUT/eval_long_prompts.jsonl, when it exists)")
    ap.add_argument("--device", default=None)
    args = ap.parse_args()
    run_eval(args.out, args.device, args.prompts, long_path=args.long_prompts)


if __name__ == "__main__":
    main()
