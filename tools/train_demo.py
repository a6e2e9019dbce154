#!/usr/bin/env python3
"""Train the diffscope demo models: a small DiffLlama and its Transformer (Llama) twin.

Runs offline on one GPU machine (PyTorch 2.11, transformers 5.17, tokenizers 0.23):

    PYTHONUNBUFFERED=1 python3 tools/train_demo.py --out $OUT/demo

and in a cheap CPU smoke mode:

    python3 tools/train_demo.py --smoke --out /tmp/demo-smoke

Steps: (1) corpus from text already on the machine + generated retrieval tasks (tools/demo_data.py), short ones
and long multi-needle ones for a last phase at 4096 positions;
(2) byte-level BPE tokenizer; (3) DiffLlamaForCausalLM and LlamaForCausalLM with the same width,
depth, data, steps and seed -- the twin has the same num_attention_heads H (H heads of width d),
the DiffLlama turns them into H/2 differential heads with value width 2d, so the two have the same
parameter count up to 4*d lambda values per layer; (4) bf16 safetensors HF directories with
tokenizer.json and a generated MODEL_CARD.md; (5) evaluation (tools/eval_demo.py).

Outputs under --out:
    diffllama-demo/  llama-demo/        config.json, generation_config.json, model.safetensors,
                                        tokenizer.json, tokenizer_config.json, MODEL_CARD.md
    loss_log.tsv                        model, step, loss, text_loss, task_loss, lr (every step)
    eval.json, eval_prompts.jsonl       evaluation (see tools/eval_demo.py); eval_long_prompts.jsonl: long context
    test_prompts.jsonl                  12 short + a few long prompts for the engine's CPU test
                                        (copy to tests/demo_eval_prompts.jsonl)
    train_summary.json, train_log.txt   hyper-parameters, timings, corpus, device, versions
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import platform
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_data as dd  # noqa: E402

try:
    from transformers.utils import logging as _hf_logging
    _hf_logging.disable_progress_bar()
except Exception:  # noqa: BLE001
    pass

# ------------------------------------------------------------------------------------------------
# Hyper-parameters (the GPU run). --smoke overrides some of them below.
# ------------------------------------------------------------------------------------------------
HP = dict(
    seed=1234,
    corpus_mb=40.0,            # natural text read from the machine
    task_tokens=30_000_000,    # size of the generated retrieval-task pool (tokens, approx.)
    tok_train_task_mb=8.0,     # task text mixed into the tokenizer's training data
    vocab_size=8192,
    hidden_size=256,
    num_hidden_layers=6,
    num_attention_heads=8,     # DiffLlama: 4 differential heads of width 32 (V width 64); Llama: 8 heads
    num_key_value_heads=4,     # even, as DiffLlama requires; GQA 8/4
    head_dim=32,
    intermediate_size=640,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    lambda_std_dev=0.1,
    seq_len=512,
    batch_size=64,             # sequences per step: half natural text, half retrieval tasks
    # long-context phase: the last long_frac of the steps run on long_seq_len-token rows (same tokens per step),
    # half natural text, half tasks: long multi-needle retrieval (1K-4K tokens), long key-value lookups and short
    # tasks, whole tasks packed into rows
    long_seq_len=4096,
    long_batch_size=8,
    long_frac=0.25,
    long_task_tokens=16_000_000,   # size of the long-task pool (tokens, approx.)
    long_task_min_tokens=1024,
    long_task_short_frac=0.3,      # share of short (phase-1 style) tasks mixed into the long rows
    long_task_kv_frac=0.2,         # share of long key-value lookups (the rest: long multi-needle retrieval)
    max_positions=8192,            # max_position_embeddings of both configs
    task_fraction=0.5,
    lr=1e-3,
    min_lr_frac=0.1,
    warmup_steps=200,
    weight_decay=0.1,
    betas=(0.9, 0.95),
    grad_clip=1.0,
    train_seconds=225.0,       # time budget of the DiffLlama (the slower of the two), sets the step count
    min_steps=300,
    max_steps=12000,
    bench_steps=15,
    eval_per_kind=200,         # held-out prompts per task kind
    eval_seed=987_654,
    long_eval_lengths=(1024, 2048, 4096),   # long-context evaluation (tools/make_needle_set.py prompts)
    long_eval_depths=(0.0, 0.25, 0.5, 0.75, 1.0),
    long_eval_per_cell=6,      # per length x depth and haystack (built-in filler, corpus sentences)
    long_eval_needles=3,
    long_eval_distractors=2,
    test_prompts_long=(1024, 2048),   # long prompts in test_prompts.jsonl (the engine's CPU test)
    extra_queries=4,           # training tasks carry 0..4 further queries after the first
    max_model_mb=32.0,         # both models together, bf16 safetensors (MiB)
)
SMOKE = dict(
    corpus_mb=0.4, task_tokens=120_000, tok_train_task_mb=0.1, vocab_size=600, hidden_size=64,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    intermediate_size=128, seq_len=128, batch_size=8, warmup_steps=5, train_seconds=30.0,
    min_steps=20, max_steps=20, bench_steps=2, eval_per_kind=6,
    long_seq_len=512, long_batch_size=2, long_task_tokens=150_000, long_task_min_tokens=128, max_positions=1024,
    long_eval_lengths=(256, 512), long_eval_per_cell=1, test_prompts_long=(256,),
)

LOG_LINES: list[str] = []


def log(*a):
    s = " ".join(str(x) for x in a)
    LOG_LINES.append(s)
    print(s, flush=True)


def seed_all(seed: int):
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


# ------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------
_SHARED: dict = {}   # filler lists for the task generator's forked workers (inherited, not pickled)


def _task_shard(args):
    seed, shard, n, max_chars, extra = args
    return list(dd.task_stream(f"{seed}:tasks:{shard}", _SHARED["words"], _SHARED["filler"], n, max_chars, extra))


def _long_shard(args):
    """Long tasks (min_chars..max_chars): multi-needle retrieval, a kv_frac share of long key-value lookups and a
    short_frac share of phase-1 style short tasks."""
    seed, shard, n, min_chars, max_chars, short_chars, short_frac, kv_frac, extra = args
    rng = random.Random(f"{seed}:long:{shard}")
    w, f, simple = _SHARED["words"], _SHARED["filler"], _SHARED["simple"]
    out = []
    for _ in range(n):
        r = rng.random()
        if r < short_frac:
            out.append(dd.task_text(dd.make_task(rng, w, f, short_chars, max_extra=extra)))
        elif r < short_frac + kv_frac:
            # records run at about 2.8 characters a token: the same token range as the needle tasks
            out.append(dd.task_text(dd.long_kv_task(rng, w, int(max_chars * 0.68), int(min_chars * 0.68), extra)))
        else:
            out.append(dd.task_text(dd.long_task(rng, w, f, simple, max_chars, min_chars, extra)))
    return out


def _run_shards(fn, shards):
    procs = min(len(shards), max(1, (os.cpu_count() or 1) - 1))
    parts = None
    if procs > 1:
        try:
            with mp.get_context("fork").Pool(procs) as pool:
                parts = pool.map(fn, shards)
        except Exception as ex:  # noqa: BLE001  (same result, just slower)
            log(f"  task generation pool failed ({ex!r}); generating serially")
    if parts is None:
        parts = [fn(s) for s in shards]
    return [t for p in parts for t in p]


def generate_tasks(seed, n_tasks, max_chars, extra, shard_size=4000):
    return _run_shards(_task_shard, [(seed, i, min(shard_size, n_tasks - i * shard_size), max_chars, extra)
                                     for i in range((n_tasks + shard_size - 1) // shard_size)])


def generate_long_tasks(seed, n_tasks, min_chars, max_chars, short_chars, short_frac, kv_frac, extra,
                        shard_size=200):
    return _run_shards(_long_shard, [(seed, i, min(shard_size, n_tasks - i * shard_size), min_chars, max_chars,
                                      short_chars, short_frac, kv_frac, extra)
                                     for i in range((n_tasks + shard_size - 1) // shard_size)])


def train_tokenizer(texts, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=[dd.BOS, dd.EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer, length=len(texts))
    bos = tok.token_to_id(dd.BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{dd.BOS} $A", pair=f"{dd.BOS} $A {dd.BOS} $B", special_tokens=[(dd.BOS, bos)])
    return tok


def encode_docs(tok, texts, bos, eos, batch=2000):
    """[[BOS] doc [EOS]] per text (int32 arrays)."""
    parts = []
    for i in range(0, len(texts), batch):
        for e in tok.encode_batch_fast(texts[i:i + batch], add_special_tokens=False):
            parts.append(np.asarray([bos] + e.ids + [eos], dtype=np.int32))
    return parts


def cut_rows(flat, seq_len):
    rows = len(flat) // (seq_len + 1)
    return flat[: rows * (seq_len + 1)].reshape(rows, seq_len + 1)


def pack(tok, texts, seq_len, bos, eos, batch=2000):
    """[BOS] doc [EOS] [BOS] doc [EOS] ... cut into rows of seq_len+1 tokens (int32); also the flat stream."""
    parts = encode_docs(tok, texts, bos, eos, batch)
    flat = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    return cut_rows(flat, seq_len), len(flat), flat


def pack_whole(docs, seq_len, text_flat, max_open=16):
    """Rows of seq_len+1 tokens holding whole tasks (first fit, at most max_open rows filling at once); the room a
    row has left when it closes is filled, in front of its tasks, with a piece of the natural-text stream. A task
    is never cut, so every question sits in the row of its haystack. Returns (rows, task tokens, dropped tasks)."""
    L = seq_len + 1
    rows, open_rows = [], []   # open: [used, [arrays]]
    ptr, dropped, used_total = 0, 0, 0

    def close(r):
        nonlocal ptr
        need = L - r[0]
        if ptr + need > len(text_flat):
            ptr = 0
        rows.append(np.concatenate([text_flat[ptr:ptr + need]] + r[1]))
        ptr += need

    for t in docs:
        if len(t) > L:
            dropped += 1
            continue
        used_total += len(t)
        for r in open_rows:
            if r[0] + len(t) <= L:
                r[0] += len(t)
                r[1].append(t)
                break
        else:
            open_rows.append([len(t), [t]])
            if len(open_rows) > max_open:
                k = max(range(len(open_rows)), key=lambda i: open_rows[i][0])
                close(open_rows.pop(k))
    for r in open_rows:
        close(r)
    return np.stack(rows) if rows else np.zeros((0, L), np.int32), used_total, dropped


# ------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------
def make_configs(hp, bos, eos):
    from transformers import DiffLlamaConfig, LlamaConfig
    common = dict(
        vocab_size=hp["vocab_size"], hidden_size=hp["hidden_size"],
        intermediate_size=hp["intermediate_size"], num_hidden_layers=hp["num_hidden_layers"],
        num_attention_heads=hp["num_attention_heads"], num_key_value_heads=hp["num_key_value_heads"],
        head_dim=hp["head_dim"], hidden_act="silu", max_position_embeddings=hp["max_positions"],
        initializer_range=0.02, rms_norm_eps=hp["rms_norm_eps"], use_cache=True,
        bos_token_id=bos, eos_token_id=eos, pad_token_id=None, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": hp["rope_theta"]},
        attention_bias=False, attention_dropout=0.0,
    )
    diff = DiffLlamaConfig(lambda_std_dev=hp["lambda_std_dev"], **common)
    base = LlamaConfig(mlp_bias=False, **common)
    return diff, base


def build_model(kind, cfg, seed, device, attn="sdpa"):
    from transformers import DiffLlamaForCausalLM, LlamaForCausalLM
    seed_all(seed)
    cls = DiffLlamaForCausalLM if kind == "diff" else LlamaForCausalLM
    cfg._attn_implementation = attn
    model = cls(cfg)
    model.to(device=device, dtype=torch.float32)
    return model


def count_params(model):
    # tied weights are one Parameter, counted once
    return sum(p.numel() for p in model.parameters())


def lr_at(step, total, hp):
    if step < hp["warmup_steps"]:
        return hp["lr"] * (step + 1) / hp["warmup_steps"]
    t = (step - hp["warmup_steps"]) / max(1, total - hp["warmup_steps"])
    return hp["lr"] * (hp["min_lr_frac"] + (1 - hp["min_lr_frac"]) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def make_optimizer(model, hp, device):
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": hp["weight_decay"]},
              {"params": no_decay, "weight_decay": 0.0}]
    kw = dict(lr=hp["lr"], betas=tuple(hp["betas"]), eps=1e-8)
    if device.type == "cuda":
        kw["fused"] = True
    return torch.optim.AdamW(groups, **kw)


class Batcher:
    """Same seeded sequence of batches for both models: half text rows, half task rows."""

    def __init__(self, text_rows, task_rows, batch_size, hp, device, seed):
        self.text = torch.from_numpy(text_rows).to(device)
        self.task = torch.from_numpy(task_rows).to(device)
        self.n_task = int(round(batch_size * hp["task_fraction"]))
        self.n_text = batch_size - self.n_task
        self.device, self.seed = device, seed
        self.reset()

    def reset(self):
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(self.seed)

    def next(self):
        a = torch.randint(0, self.text.shape[0], (self.n_text,), generator=self.gen, device=self.device)
        b = torch.randint(0, self.task.shape[0], (self.n_task,), generator=self.gen, device=self.device)
        return torch.cat([self.text[a], self.task[b]], 0).long()


def long_start(steps, hp):
    """First step of the long-context phase (the last long_frac of the steps)."""
    return steps - int(round(hp["long_frac"] * steps))


def train_steps(model, phases, hp, total_steps, device, name, loss_buf=None, progress=True):
    """Runs total_steps optimizer steps, one learning-rate schedule over all of them; phases = [(first step,
    Batcher), ...] in order. loss_buf[step] = (loss, text_loss, task_loss, lr)."""
    if not isinstance(phases, (list, tuple)):
        phases = [(0, phases)]
    opt = make_optimizer(model, hp, device)
    model.train()
    use_amp = device.type == "cuda"
    t0 = time.time()
    every = max(1, total_steps // 25)
    for step in range(total_steps):
        lr = lr_at(step, total_steps, hp)
        for g in opt.param_groups:
            g["lr"] = lr
        batcher = [b for s0, b in phases if s0 <= step][-1]
        n_text = batcher.n_text
        x = batcher.next()
        inp, tgt = x[:, :-1], x[:, 1:]
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_amp):
            logits = model(input_ids=inp, use_cache=False).logits
        tok_loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                                   reduction="none").view(tgt.shape)
        loss = tok_loss.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), hp["grad_clip"])
        opt.step()
        if loss_buf is not None:
            loss_buf[step, 0] = loss.detach()
            loss_buf[step, 1] = tok_loss[:n_text].detach().mean()
            loss_buf[step, 2] = tok_loss[n_text:].detach().mean()
            loss_buf[step, 3] = lr
        if progress and (step % every == 0 or step == total_steps - 1):
            l = loss_buf[step].tolist() if loss_buf is not None else [loss.item()] * 3
            el = time.time() - t0
            log(f"  [{name}] step {step + 1:5d}/{total_steps}  loss {l[0]:.3f}  text {l[1]:.3f}  "
                f"task {l[2]:.3f}  lr {lr:.2e}  seq {x.shape[1] - 1}  {el:6.1f}s")
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.time() - t0


@torch.no_grad()
def lambdas(model):
    out = []
    for i, layer in enumerate(model.model.layers):
        a = layer.self_attn
        l1 = torch.exp(torch.sum(a.lambda_q1.float() * a.lambda_k1.float()))
        l2 = torch.exp(torch.sum(a.lambda_q2.float() * a.lambda_k2.float()))
        out.append(float(l1 - l2 + a.lambda_init))
    return out


# ------------------------------------------------------------------------------------------------
# Model card
# ------------------------------------------------------------------------------------------------
def write_model_card(path, kind, summary, eval_res):
    hp = summary["hp"]
    m = summary["models"][kind]
    other = "llama" if kind == "diff" else "diff"
    H, d = hp["num_attention_heads"], hp["head_dim"]
    if kind == "diff":
        title = "diffllama-demo: a tiny DiffLlama (differential attention) for diffscope"
        arch = (f"`DiffLlamaForCausalLM` (transformers `model_type: diffllama`). {hp['num_hidden_layers']} layers, "
                f"hidden {hp['hidden_size']}, `num_attention_heads` {H} = {H // 2} differential heads "
                f"(query/key width {d}, value width {2 * d}), {hp['num_key_value_heads']} KV heads "
                f"(GQA), SwiGLU MLP {hp['intermediate_size']}, RoPE theta {hp['rope_theta']:g}, tied embeddings. "
                f"lambda_init(l) = 0.8 - 0.6*exp(-0.3*l).")
        twin = "`llama-demo` (the Transformer twin)"
    else:
        title = "llama-demo: the Transformer twin of diffllama-demo, for diffscope"
        arch = (f"`LlamaForCausalLM`. {hp['num_hidden_layers']} layers, hidden {hp['hidden_size']}, "
                f"{H} attention heads of width {d}, {hp['num_key_value_heads']} KV heads (GQA), SwiGLU MLP "
                f"{hp['intermediate_size']}, RoPE theta {hp['rope_theta']:g}, tied embeddings. Same config as "
                f"the DiffLlama minus lambda and the inner norm: twice the heads of the differential model.")
        twin = "`diffllama-demo` (the differential model)"
    corpus = summary["corpus"]
    src = "\n".join(f"| {s['name']} | {s['files']} | {s['bytes'] / 1e6:.2f} MB |" for s in corpus["sources"])
    e = eval_res["models"].get(kind, {}) if eval_res else {}
    eo = eval_res["models"].get(other, {}) if eval_res else {}

    def row(name, r):
        if not r:
            return f"| {name} | n/a | n/a | n/a | n/a | n/a |"
        a = r["all"]
        return (f"| {name} | {r['kv']['accuracy']:.3f} | {r['needle']['accuracy']:.3f} | "
                f"{a['attn_answer']:.3f} | {a['attn_noise']:.3f} | {a['attn_bos']:.3f} |")

    names = {"diff": "diffllama-demo", "llama": "llama-demo"}
    n_eval = "n/a"
    if eval_res and eval_res["models"]:
        r0 = next(iter(eval_res["models"].values()))
        n_eval = (f"{eval_res['n_prompts']} prompts ({r0.get('kv', {}).get('n', 0)} key-value, "
                  f"{r0.get('needle', {}).get('n', 0)} needle)")
    other_norms = "n/a"
    if eval_res:
        parts = []
        for k in ("diff", "llama"):
            r = eval_res["models"].get(k)
            if r:
                bn = r["all"]["by_norm"]
                parts.append(f"{names[k]} raw {bn['raw']['answer']:.3f} / {bn['raw']['noise']:.3f}, "
                             f"divided by the row sum {bn['sum1']['answer']:.3f} / {bn['sum1']['noise']:.3f}")
        other_norms = "; ".join(parts)
    long_table = "Not evaluated."
    if eval_res and any("long" in r for r in eval_res["models"].values()):
        ks = [k for k in ("diff", "llama") if "long" in eval_res["models"].get(k, {})]
        lg0 = eval_res["models"][ks[0]]["long"]
        lens, deps = list(lg0["by_length"]), list(lg0["by_depth"])
        head = ("| model | " + " | ".join(f"acc {l}" for l in lens) + " | " + " | ".join(f"acc depth {x}" for x in deps)
                + " | acc all | attn to answer | attn to noise |")
        lines = [head, "|" + "---|" * (len(lens) + len(deps) + 4)]
        for k in ks:
            lg = eval_res["models"][k]["long"]
            s1 = lg["by_norm"]["sum1"]
            lines.append(f"| {names[k]} | " + " | ".join(f"{lg['by_length'][l]['accuracy']:.3f}" for l in lens) + " | "
                         + " | ".join(f"{lg['by_depth'][x]['accuracy']:.3f}" for x in deps)
                         + f" | {lg['accuracy']:.3f} | {s1['answer']:.3f} | {s1['noise']:.3f} |")
        long_table = (f"{lg0['n']} prompts made by `tools/make_needle_set.py` with this tokenizer (seed {hp['eval_seed']}): "
                      f"lengths {', '.join(lens)} tokens, the queried needle at depths {', '.join(deps)}, "
                      f"{hp['long_eval_needles']} needles (one queried) and {hp['long_eval_distractors']} near-miss "
                      f"distractors, {hp['long_eval_per_cell']} prompts per length and depth in each of two haystacks "
                      f"(the built-in filler sentences, and sentences of the corpus). Attention as above, rows divided "
                      f"by their sum (layers with |1 - lambda| < 0.05 skipped).\n\n" + "\n".join(lines))
    lam = ""
    if kind == "diff":
        lam = "\nLearned lambda per layer (after training): " + ", ".join(f"{v:.3f}" for v in m["lambda"]) + "\n"
    card = f"""# {title}

Generated by `tools/train_demo.py` in the run that trained the weights; do not edit
by hand, re-run the script instead. Twin: {twin}. Both were trained with the same width, depth, data,
batches, steps and seed.

## Model
{arch}

- Parameters: {m['params']:,} (the twin: {summary['models'][other]['params']:,}; the difference is the
  4*d = {4 * d} lambda values per layer of the DiffLlama).
- Weights: `model.safetensors`, bf16, {m['safetensors_bytes'] / 1e6:.2f} MB. Trained in fp32 with bf16 autocast.
- Tokenizer: `tokenizer.json`, byte-level BPE (GPT-2 style ByteLevel pre-tokenizer), vocab {hp['vocab_size']},
  special tokens `<|bos|>` (id {summary['bos_id']}) and `<|eos|>` (id {summary['eos_id']}); its post-processor adds `<|bos|>`.
- Context: trained on {hp['seq_len']}-token sequences, then (the last {summary['steps'] - summary['long_start_step'] + 1}
  steps) on {hp['long_seq_len']}-token sequences; `max_position_embeddings` {hp['max_positions']} (positions past
  {hp['long_seq_len']} were never trained).
{lam}
## Data
Nothing downloaded: the corpus is text already on the training machine, read in sorted order and
sampled with seed {hp['seed']} (corpus sha256 `{corpus['sha256'][:16]}...`, {corpus['documents']} documents,
{corpus['total_bytes'] / 1e6:.1f} MB):

| source | files | text |
|---|---|---|
{src}

Mixed {int(100 * (1 - hp['task_fraction']))}/{int(100 * hp['task_fraction'])} per batch with generated retrieval tasks
({summary['task_count']:,} tasks, {summary['task_tokens']:,} tokens), half of each kind:
- key-value lookup: `records: 4821 -> otter; 4812 -> cedar; ... query: 4821 ->` ` otter`, with 1-4
  near-duplicate keys (one digit changed or two swapped) among 4-80 records;
- needle in a haystack: a fact (`The secret word of the blue door is otter.`) buried among filler sentences
  taken from the corpus, with 1-5 near-duplicate distractor facts (same colour or object or attribute), then
  `Question: what is the secret word of the blue door? Answer:` ` otter`.

Long-context phase ({hp['long_seq_len']}-token rows, half natural text, half tasks): {summary['long_task_count']:,} generated
tasks ({summary['long_task_tokens']:,} tokens), {round(100 * (1 - hp['long_task_short_frac'] - hp['long_task_kv_frac']))}% of them multi-needle retrieval in
haystacks of about {hp['long_task_min_tokens']}-{hp['long_seq_len']} tokens: 1-8 facts with distinct subjects
(one queried) and 0-6 near misses of the queried one, each at a random depth (the queried one at the very start
or end one time in five), among corpus sentences or the built-in filler sentences of `tools/make_needle_set.py`;
{round(100 * hp['long_task_kv_frac'])}% key-value lookups of the same lengths; {round(100 * hp['long_task_short_frac'])}% short tasks as above. Whole tasks are
packed into {summary['long_task_rows']:,} rows (never cut; the room left in a row is natural text in front of them).

Training examples append 0-{summary['hp'].get('extra_queries', 4)} further queries with their answers (denser retrieval signal);
evaluation prompts stop at the first answer. Generator: `tools/demo_data.py`.

## Training
AdamW (betas {tuple(hp['betas'])}, weight decay {hp['weight_decay']}), lr {hp['lr']:g}, {hp['warmup_steps']} warm-up steps,
cosine to {hp['min_lr_frac']:g}x over all steps, grad clip {hp['grad_clip']}, {summary['steps']} steps, seed {hp['seed']}:
steps 1-{summary['long_start_step'] - 1} batch {hp['batch_size']} x {hp['seq_len']} tokens, steps {summary['long_start_step']}-{summary['steps']}
batch {hp['long_batch_size']} x {hp['long_seq_len']} tokens ({((summary['long_start_step'] - 1) * hp['batch_size'] * hp['seq_len'] + (summary['steps'] - summary['long_start_step'] + 1) * hp['long_batch_size'] * hp['long_seq_len']) / 1e6:.1f} M tokens in all),
attention `{summary['attn_impl']}` while training.
Training time {m['train_seconds']:.0f} s on {summary['device']} (torch {summary['versions']['torch']},
transformers {summary['versions']['transformers']}, tokenizers {summary['versions']['tokenizers']}).
Final loss (mean of the last 50 steps): {m['final_loss']:.3f} (text {m['final_text_loss']:.3f}, tasks {m['final_task_loss']:.3f}).
Loss curves: `loss_log.tsv` of the run.

## Evaluation (held-out retrieval prompts, seed {hp['eval_seed']})
{n_eval}. Accuracy: greedy next tokens equal the answer.
Attention: the row of the last prompt token, summed over the answer span in the context (answer) and over the
rest of the context (noise, excluding `<|bos|>` and the question), averaged over heads, layers and prompts.
For the DiffLlama the map is the difference A1 - lambda*A2 per differential head; every row is divided by
the sum of its absolute values (a softmax row is unchanged by this). See `eval.json` for per-layer numbers
and the other normalisations.

| model | acc kv | acc needle | attn to answer | attn to noise | attn to bos |
|---|---|---|---|---|---|
{row(names['diff'], e if kind == 'diff' else eo)}
{row(names['llama'], e if kind == 'llama' else eo)}

Other normalisations (answer / noise): {other_norms}

### Long context
{long_table}

## Intended use and limits
A demo for diffscope's attention viewer: small enough to ship in the repository, trained just long enough to
show differential attention cancelling attention noise on retrieval prompts. It is not a useful language
model. The training text is source code and documentation of installed software under their own licences;
these weights are provided for testing and demonstration only.
"""
    with open(path, "w") as f:
        f.write(card)


def short_record(t):
    return {"kind": t.kind, "prompt": t.prompt, "answer": t.answer, "span": list(t.span),
            "question_start": t.question_start}


def long_record(r, haystack):
    """A tools/make_needle_set.py prompt in the evaluation's format (kind "long")."""
    return {"kind": "long", "prompt": r["text"], "answer": r["target"], "span": r["answer"],
            "question_start": r["question_start"], "length": r["length"], "depth": r["depth"],
            "needles": r["needles"], "distractors": r["distractors"], "haystack": haystack,
            "answer_token": r["answer_token"]}


def long_eval_prompts(tok, corpus_filler, hp):
    """Held-out long-context prompts by tools/make_needle_set.py with the trained tokenizer: every length x depth,
    long_eval_per_cell with the built-in filler and as many with corpus sentences as the haystack."""
    import make_needle_set as mns
    counter = mns.Counter(tokenizer=tok)
    out = []
    for name, maker, seed in (("builtin", mns.Maker(counter), hp["eval_seed"]),
                              ("corpus", mns.Maker(counter, corpus_filler), hp["eval_seed"] + 1)):
        for r in mns.build_set(maker, list(hp["long_eval_lengths"]), list(hp["long_eval_depths"]),
                               hp["long_eval_needles"], hp["long_eval_distractors"], hp["long_eval_per_cell"], seed):
            out.append(long_record(r, name))
    return out


def test_long_prompts(tok, hp):
    """A few long prompts for the engine's CPU test: built-in filler, depths 0.25 and 0.75."""
    import make_needle_set as mns
    maker = mns.Maker(mns.Counter(tokenizer=tok))
    rows = mns.build_set(maker, list(hp["test_prompts_long"]), [0.25, 0.75], hp["long_eval_needles"],
                         hp["long_eval_distractors"], 1, hp["eval_seed"] + 2)
    return [long_record(r, "builtin") for r in rows]


# ------------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run: tiny corpus, models, 20 steps")
    ap.add_argument("--steps", type=int, default=None, help="fix the step count (skips the timing benchmark)")
    ap.add_argument("--train-seconds", type=float, default=None, help="time budget per model (sets steps)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    ap.add_argument("--no-eval", action="store_true")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="override hyper-parameters of HP, e.g. --set lr=2e-3 num_hidden_layers=4")
    args = ap.parse_args()

    hp = dict(HP)
    if args.smoke:
        hp.update(SMOKE)
    for kv in args.set:
        k, v = kv.split("=", 1)
        if k not in HP:
            raise SystemExit(f"unknown hyper-parameter {k}")
        hp[k] = type(HP[k])(v) if not isinstance(HP[k], tuple) else tuple(type(HP[k][0])(t) for t in v.split(","))
    if args.train_seconds is not None:
        hp["train_seconds"] = args.train_seconds
    t_start = time.time()
    import tokenizers
    import transformers
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__, "tokenizers": tokenizers.__version__}
    os.makedirs(args.out, exist_ok=True)
    log(f"diffscope demo training  versions={versions}  smoke={args.smoke}")
    seed_all(hp["seed"])

    # 1. corpus + tasks ----------------------------------------------------------------------
    t0 = time.time()
    docs, corpus_info = dd.collect_corpus(hp["corpus_mb"], hp["seed"], log=log)
    filler = dd.filler_sentences(docs, hp["seed"])
    log(f"corpus: {corpus_info['documents']} docs, {corpus_info['total_bytes'] / 1e6:.1f} MB, "
        f"{len(filler)} filler sentences ({time.time() - t0:.1f}s)")

    # 2. retrieval tasks (before the tokenizer and CUDA are touched: the generator forks) ------
    t1 = time.time()
    _SHARED.update(words=dd.WORDS, filler=filler, simple=dd.haystack_filler())
    train_chars = int(hp["seq_len"] * 3.3)     # approx. one sequence; tasks are packed anyway
    n_tasks = max(100, int(hp["task_tokens"] * 3.5 / (train_chars * 0.55)))
    tasks = generate_tasks(hp["seed"], n_tasks, train_chars, hp["extra_queries"])
    log(f"tasks: {len(tasks):,} generated, {sum(map(len, tasks)) / 1e6:.1f} MB ({time.time() - t1:.1f}s)")
    # long multi-needle tasks for the long phase: long_task_min_tokens..long_seq_len tokens (haystacks of filler
    # sentences run at about 4.1 characters a token; the few that come out longer than a row are dropped)
    t1 = time.time()
    long_min_chars = int(hp["long_task_min_tokens"] * 4.1)
    long_max_chars = int((hp["long_seq_len"] - 80) * 4.1)
    mean_tokens = (1 - hp["long_task_short_frac"]) * (long_min_chars + long_max_chars) / 2 / 4.1 + \
        hp["long_task_short_frac"] * train_chars * 0.55 / 3.5
    n_long = max(20, int(hp["long_task_tokens"] / mean_tokens))
    long_tasks = generate_long_tasks(hp["seed"], n_long, long_min_chars, long_max_chars, train_chars,
                                     hp["long_task_short_frac"], hp["long_task_kv_frac"], hp["extra_queries"])
    log(f"long tasks: {len(long_tasks):,} generated ({long_min_chars}-{long_max_chars} characters, "
        f"{int(100 * hp['long_task_short_frac'])}% short ones and {int(100 * hp['long_task_kv_frac'])}% long "
        f"key-value lookups among them), "
        f"{sum(map(len, long_tasks)) / 1e6:.1f} MB ({time.time() - t1:.1f}s)")

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))

    # 3. tokenizer (natural text + a sample of task text, so task words become tokens) ----------
    t1 = time.time()
    sample_n = min(len(tasks), max(50, int(hp["tok_train_task_mb"] * 1e6 / (train_chars * 0.55))))
    tok = train_tokenizer(docs + tasks[:sample_n] + long_tasks[:max(10, len(long_tasks) // 20)], hp["vocab_size"])
    bos, eos = tok.token_to_id(dd.BOS), tok.token_to_id(dd.EOS)
    ids = [e.ids for e in tok.encode_batch_fast(tasks[:2000], add_special_tokens=False)]
    cpt = sum(map(len, tasks[:2000])) / max(1, sum(map(len, ids)))
    single = sum(1 for w in dd.WORDS if len(tok.encode(" " + w, add_special_tokens=False).ids) == 1)
    log(f"tokenizer: vocab {tok.get_vocab_size()}, {cpt:.2f} chars/token on tasks, "
        f"{single}/{len(dd.WORDS)} value words are one token ({time.time() - t1:.1f}s)")

    # 4. token rows -------------------------------------------------------------------------
    t2 = time.time()
    text_rows, n_text_tok, text_flat = pack(tok, docs, hp["seq_len"], bos, eos)
    task_rows, n_task_tok, _ = pack(tok, tasks, hp["seq_len"], bos, eos)
    log(f"data: text {n_text_tok:,} tokens -> {len(text_rows):,} rows; tasks {n_task_tok:,} tokens -> "
        f"{len(task_rows):,} rows of {hp['seq_len'] + 1} ({time.time() - t2:.1f}s)")
    t2 = time.time()
    long_text_rows = cut_rows(text_flat, hp["long_seq_len"])
    long_docs = encode_docs(tok, long_tasks, bos, eos)
    long_task_rows, n_long_tok, dropped = pack_whole(long_docs, hp["long_seq_len"], text_flat)
    lens = np.array([len(t) for t in long_docs])
    log(f"long data: text -> {len(long_text_rows):,} rows; long tasks {n_long_tok:,} tokens (median "
        f"{int(np.median(lens))}, max {int(lens.max())}, {dropped} too long dropped) -> {len(long_task_rows):,} "
        f"rows of {hp['long_seq_len'] + 1}, {100 * n_long_tok / max(1, long_task_rows.size):.0f}% task tokens "
        f"({time.time() - t2:.1f}s)")
    del long_docs
    task_chars = int(hp["seq_len"] * cpt * 0.9)
    eval_set = dd.eval_tasks(hp["eval_seed"], dd.WORDS, filler, hp["eval_per_kind"], task_chars)
    # keep only prompts that fit in seq_len tokens with their answer
    eval_set = [t for t in eval_set
                if len(tok.encode(t.prompt).ids) + len(tok.encode(t.answer, add_special_tokens=False).ids)
                <= hp["seq_len"]]
    with open(os.path.join(args.out, "eval_prompts.jsonl"), "w") as f:
        for t in eval_set:
            f.write(json.dumps(short_record(t)) + "\n")
    log(f"eval prompts: {len(eval_set)} (held-out seed {hp['eval_seed']})")
    t2 = time.time()
    long_eval = long_eval_prompts(tok, filler, hp)
    with open(os.path.join(args.out, "eval_long_prompts.jsonl"), "w") as f:
        for r in long_eval:
            f.write(json.dumps(r) + "\n")
    log(f"long eval prompts: {len(long_eval)} (tools/make_needle_set.py: lengths {list(hp['long_eval_lengths'])}, "
        f"depths {list(hp['long_eval_depths'])}, {hp['long_eval_needles']} needles, "
        f"{hp['long_eval_distractors']} distractors, built-in and corpus filler) ({time.time() - t2:.1f}s)")
    # the engine's CPU test (tests/test_demo_models.cpp reads tests/demo_eval_prompts.jsonl, a copy of this file)
    with open(os.path.join(args.out, "test_prompts.jsonl"), "w") as f:
        for t in [t for t in eval_set if t.kind == "kv"][:6] + [t for t in eval_set if t.kind == "needle"][:6]:
            f.write(json.dumps(short_record(t)) + "\n")
        for r in test_long_prompts(tok, hp):
            f.write(json.dumps(r) + "\n")
    data_seconds = time.time() - t_start
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        dev_name = torch.cuda.get_device_name(device)
    else:
        dev_name = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} threads)"
    log(f"device: {dev_name}")

    # 5. models -------------------------------------------------------------------------------
    diff_cfg, base_cfg = make_configs(hp, bos, eos)
    attn = "sdpa"
    batcher = Batcher(text_rows, task_rows, hp["batch_size"], hp, device, hp["seed"])
    long_batcher = Batcher(long_text_rows, long_task_rows, hp["long_batch_size"], hp, device, hp["seed"] + 1)
    try:
        m = build_model("diff", diff_cfg, hp["seed"], device, attn)
    except Exception as ex:  # noqa: BLE001
        log(f"sdpa unavailable for DiffLlama ({ex!r}); using eager")
        attn = "eager"
        m = build_model("diff", diff_cfg, hp["seed"], device, attn)
    p_diff = count_params(m)
    tmp = build_model("llama", base_cfg, hp["seed"], device, attn)
    p_base = count_params(tmp)
    del tmp
    L, d = hp["num_hidden_layers"], hp["head_dim"]
    log(f"params: DiffLlama {p_diff:,}  Llama {p_base:,}  difference {p_diff - p_base:,} "
        f"(expected 4*d*layers = {4 * d * L:,})")
    if p_diff - p_base != 4 * d * L:
        log("WARNING: parameter counts differ by more than the lambda vectors")
    est_mb = 2 * (p_diff + p_base) / 2**20
    log(f"bf16 size of both models: {est_mb:.2f} MiB (limit {hp['max_model_mb']})")
    if est_mb > hp["max_model_mb"]:
        raise SystemExit("models too large for the size limit")

    # step count: fixed, or from a short timing of the DiffLlama on both phases' batches
    per_short = per_long = None
    if args.steps is not None:
        steps = args.steps
    elif args.smoke:
        steps = hp["max_steps"]
    else:
        train_steps(m, batcher, hp, 3, device, "bench", progress=False)
        per_short = train_steps(m, batcher, hp, hp["bench_steps"], device, "bench", progress=False) / hp["bench_steps"]
        train_steps(m, long_batcher, hp, 2, device, "bench", progress=False)
        per_long = train_steps(m, long_batcher, hp, hp["bench_steps"], device, "bench",
                               progress=False) / hp["bench_steps"]
        per = (1 - hp["long_frac"]) * per_short + hp["long_frac"] * per_long
        steps = int(min(hp["max_steps"], max(hp["min_steps"], hp["train_seconds"] / per)))
        log(f"benchmark: DiffLlama {per_short * 1000:.1f} ms/step at {hp['batch_size']}x{hp['seq_len']}, "
            f"{per_long * 1000:.1f} ms/step at {hp['long_batch_size']}x{hp['long_seq_len']} -> {steps} steps "
            f"(budget {hp['train_seconds']:.0f}s per model)")
    s_long = long_start(steps, hp)
    log(f"schedule: steps 1-{s_long} at {hp['batch_size']}x{hp['seq_len']}, {s_long + 1}-{steps} at "
        f"{hp['long_batch_size']}x{hp['long_seq_len']} (one cosine learning-rate schedule over all)")
    del m
    if device.type == "cuda":
        torch.cuda.empty_cache()

    summary = {"hp": {k: (list(v) if isinstance(v, tuple) else v) for k, v in hp.items()},
               "smoke": args.smoke, "device": dev_name, "versions": versions, "steps": steps,
               "attn_impl": attn, "bos_id": bos, "eos_id": eos, "corpus": corpus_info,
               "task_count": len(tasks), "task_tokens": int(n_task_tok), "text_tokens": int(n_text_tok),
               "long_task_count": len(long_tasks), "long_task_tokens": int(n_long_tok),
               "long_task_rows": int(len(long_task_rows)), "long_text_rows": int(len(long_text_rows)),
               "long_start_step": s_long + 1, "long_eval_prompts": len(long_eval),
               "bench_ms_per_step": {"short": per_short and round(1000 * per_short, 2),
                                     "long": per_long and round(1000 * per_long, 2)},
               "data_seconds": round(data_seconds, 1), "models": {}}
    names = {"diff": "diffllama-demo", "llama": "llama-demo"}
    losses = {}
    for kind, cfg in (("diff", diff_cfg), ("llama", base_cfg)):
        model = build_model(kind, cfg, hp["seed"], device, attn)
        batcher.reset()
        long_batcher.reset()
        buf = torch.zeros(steps, 4, device=device)
        log(f"training {names[kind]}: {count_params(model):,} params, {steps} steps")
        secs = train_steps(model, [(0, batcher), (s_long, long_batcher)], hp, steps, device, kind, loss_buf=buf)
        arr = buf.cpu().numpy()
        losses[kind] = arr
        tail = arr[-min(50, steps):]
        info = {"params": count_params(model), "train_seconds": round(secs, 1),
                "final_loss": float(tail[:, 0].mean()), "final_text_loss": float(tail[:, 1].mean()),
                "final_task_loss": float(tail[:, 2].mean()),
                "ms_per_step": round(1000 * secs / max(1, steps), 2)}
        if kind == "diff":
            info["lambda"] = lambdas(model)
        # save: bf16 safetensors + tokenizer
        outdir = os.path.join(args.out, names[kind])
        os.makedirs(outdir, exist_ok=True)
        model.config._attn_implementation = "eager"     # a neutral default for whoever loads it
        model.to(torch.bfloat16).save_pretrained(outdir)
        tok.save(os.path.join(outdir, "tokenizer.json"))
        with open(os.path.join(outdir, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": dd.BOS,
                       "eos_token": dd.EOS, "pad_token": dd.EOS, "add_bos_token": True,
                       "model_max_length": hp["max_positions"], "clean_up_tokenization_spaces": False},
                      f, indent=2)
        info["safetensors_bytes"] = os.path.getsize(os.path.join(outdir, "model.safetensors"))
        summary["models"][kind] = info
        log(f"saved {outdir}: {info['safetensors_bytes'] / 1e6:.2f} MB, {secs:.0f}s training, "
            f"final loss {info['final_loss']:.3f}")
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()

    with open(os.path.join(args.out, "loss_log.tsv"), "w") as f:
        f.write("model\tstep\tloss\ttext_loss\ttask_loss\tlr\n")
        for kind in ("diff", "llama"):
            for s, (a, b, c, lr) in enumerate(losses[kind]):
                f.write(f"{names[kind]}\t{s + 1}\t{a:.4f}\t{b:.4f}\t{c:.4f}\t{lr:.3e}\n")
    total_model = sum(summary["models"][k]["safetensors_bytes"] for k in summary["models"])
    log(f"both models: {total_model / 2**20:.2f} MiB bf16 safetensors")
    if total_model > hp["max_model_mb"] * 2**20:
        log("WARNING: models exceed the size limit")

    # 6. evaluation ---------------------------------------------------------------------------
    eval_res = None
    if not args.no_eval:
        import eval_demo
        eval_res = eval_demo.run_eval(args.out, device=str(device), log=log)
    summary["total_seconds"] = round(time.time() - t_start, 1)
    for kind in ("diff", "llama"):
        write_model_card(os.path.join(args.out, names[kind], "MODEL_CARD.md"), kind, summary, eval_res)
    with open(os.path.join(args.out, "train_summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    log(f"done in {summary['total_seconds']:.0f}s -> {args.out}")
    with open(os.path.join(args.out, "train_log.txt"), "w") as f:
        f.write("\n".join(LOG_LINES) + "\n")


if __name__ == "__main__":
    main()
