#!/usr/bin/env python3
"""Generate the float64 greedy-generation references: tests/fixtures/<name>/generate.safetensors.

Run where numpy, torch and transformers are installed (no network needed: nothing is downloaded):
    python3 tests/gen_generation_fixtures.py [FIXTURES_DIR]          default FIXTURES_DIR tests/fixtures

For every fixture folder that holds expected.safetensors (made by tests/gen_fixtures.py, tests/gen_motif_fixtures.py,
tests/gen_phi4flash_fixtures.py), and for the long-prompt fixture diff_long_gen that this script makes itself, the
prompt is the fixture's input_ids and G = 10 tokens are generated greedily by REPEATED FULL FORWARDS: no KV cache,
each step runs the whole sequence so far again and appends the argmax of the last position's logits (the lowest id
among equal logits, as ds::Sampler does); EOS never stops it. The reference is independent of diffscope's C++:
    diffllama / llama   transformers' own DiffLlamaForCausalLM / LlamaForCausalLM loaded from the fixture folder
                        with dtype=torch.float64 (bf16 checkpoints widen exactly), eager attention, use_cache=False.
                        transformers' eager path upcasts RMSNorm and softmax to float32 (meant for half-precision
                        inputs); with float64 inputs that would round them to float32, so this script runs those two
                        in float64 (same formulas). The rotary angles stay as transformers computes them (float32
                        position * inv_freq: part of the model as transformers defines it, and what engine/core/rope.h
                        reproduces), as does DiffLlama's lambda (float32 sum of lambda_q . lambda_k).
    motif               tools/motif_reference.py (float64 numpy)
    phi4flash           tools/phi4flash_reference.py (float64 numpy)
Weights are used as stored (bf16 or f32 values), all arithmetic in float64; step 0's logits are checked against the
last row of expected.safetensors' logits (1e-4 relative) so that the reference is the fixture's model.

generate.safetensors (written with tools/safetensors_np.py):
    prompt_ids   [n] I64           the fixture's input_ids (diff_long_gen: 1500 seeded random ids, ids[0] = 1)
    generated    [G] I64           the greedy tokens
    step_logits  [G, vocab] F32    the last position's logits BEFORE choosing token g (step 0 = the prompt's
                                   next-token logits), computed in float64
    margin       [G] F32           top-1 minus top-2 logit at each step (float64, then stored)
    bf16_err     [G] F32           max |emulation - reference| / max |reference| of step g's logits, where the
                                   emulation is the same model as a bf16 engine computes it (weights and GEMM inputs
                                   in bf16; see transformers_fns, MotifModel / Phi4FlashModel with bf16=True), run on
                                   the reference's own sequence: how far bf16 rounding alone moves that step, the
                                   scale of the CUDA backend's tolerance (it keeps weights and GEMM inputs in bf16)
  metadata: generator, reference, G, near_tie_threshold (1e-3), near_tie_steps (comma-separated steps whose margin
  is below the threshold, "" when none), first_near_tie (-1 when none), min_margin. Nothing is changed where a margin
  is small: the C++ test (tests/test_generate_reference.cpp) compares tokens only up to the first near-tie.

The long-prompt fixture tests/fixtures/diff_long_gen/ is a small random DiffLlama made with transformers (hidden 64,
2 layers, 4 heads over 2 kv heads, head_dim 16, intermediate 64, vocab 256, tied embeddings, max_position_embeddings
2048, f32, q/k projections scaled by 3 so that the maps are sharp over 1500 keys: changing one prompt token at
position 5, 500 or 1000 moves the last logits by 2e-2, 8e-3, 4e-3 relative, far above the tests' 1e-4), saved as a
standard Hugging Face folder (config.json + model.safetensors, config in the transformers 5.x
spelling as tests/gen_fixtures.py writes it). It has no expected.safetensors (its maps would be [2, 1500, 1500] per
layer): only generate.safetensors, for a 1500-token prompt.

Deterministic: the long fixture's weights come from torch.manual_seed, its prompt from numpy's default_rng; every
reference is a deterministic float64 computation on one thread.
"""
import json
import os
import shutil
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import motif_reference as mr  # noqa: E402
import phi4flash_reference as pr  # noqa: E402
from safetensors_np import SafetensorsFile, write_safetensors  # noqa: E402

G = 10
NEAR_TIE = 1e-3
LONG_NAME = "diff_long_gen"
LONG_PROMPT = 1500
LONG_SEED = 22
LONG_QK_GAIN = 3.0  # sharper maps over 1500 keys: a varied continuation that still depends on far tokens
MAX_FILE_BYTES = 200 * 1024  # keep each generate.safetensors under this (fewer steps stored if needed)


# --------------------------------------------------------------------------------------------------------------
# transformers in float64
# --------------------------------------------------------------------------------------------------------------
def _torch():
    import torch
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    return torch


_patched = False


def _patch_transformers_float64():
    """RMSNorm and eager softmax in the input's dtype (float64) instead of transformers' float32 upcast."""
    global _patched
    if _patched:
        return
    torch = _torch()
    from transformers.models.diffllama import modeling_diffllama as md
    from transformers.models.llama import modeling_llama as ml

    def rms_forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        key_states = ml.repeat_kv(key, module.num_key_value_groups)
        value_states = ml.repeat_kv(value, module.num_key_value_groups)
        attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        attn_weights = torch.nn.functional.softmax(attn_weights, dim=-1)  # float64 in, float64 out
        attn_output = torch.matmul(attn_weights, value_states)
        return attn_output.transpose(1, 2).contiguous(), attn_weights

    for mod, norm in ((md, md.DiffLlamaRMSNorm), (ml, ml.LlamaRMSNorm)):
        norm.forward = rms_forward
        mod.eager_attention_forward = eager_attention_forward  # looked up at call time by the attention modules
    _patched = True


def transformers_fns(folder, model_type):
    """The float64 model and its bf16-engine emulation (a second copy of the model): weights of the projections,
    the embedding and the lm_head rounded to bf16, every nn.Linear input rounded to bf16, the q/k/v/gate/up
    projections' outputs rounded to bf16 -- as tools/motif_reference.py's emulation does, except that q and k are
    rounded before RoPE rather than after; norms, softmax, lambda and the residual stream stay float64."""
    torch = _torch()
    _patch_transformers_float64()
    from transformers import DiffLlamaForCausalLM, LlamaForCausalLM
    cls = DiffLlamaForCausalLM if model_type == "diffllama" else LlamaForCausalLM

    def load():
        m = cls.from_pretrained(folder, dtype=torch.float64, attn_implementation="eager").eval()
        assert all(p.dtype == torch.float64 for p in m.parameters())
        return m

    def bf(t):
        return t.to(torch.bfloat16).to(t.dtype)

    model, emu = load(), load()
    with torch.no_grad():
        for pname, p in emu.named_parameters():
            if pname.endswith("proj.weight") or "embed_tokens" in pname or "lm_head" in pname:
                p.copy_(bf(p))
    for mname, mod in emu.named_modules():
        if isinstance(mod, torch.nn.Linear):
            mod.register_forward_pre_hook(lambda m, args: (bf(args[0]),) + tuple(args[1:]))
            if mname.endswith(("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")):
                mod.register_forward_hook(lambda m, args, out: bf(out))

    def runner(m):
        def fn(ids):
            with torch.no_grad():
                out = m(input_ids=torch.tensor(np.asarray(ids, dtype=np.int64))[None], use_cache=False)
            lg = out.logits[0, -1]
            assert lg.dtype == torch.float64
            return lg.numpy().astype(np.float64)
        return fn
    desc = f"transformers {__import__('transformers').__version__} {cls.__name__} (float64, eager, no cache)"
    return runner(model), runner(emu), desc


def reference_fns(folder):
    """(float64 reference, its bf16-engine emulation, description): each maps a sequence of ids to the last
    position's logits (float64)."""
    with open(os.path.join(folder, "config.json")) as f:
        model_type = json.load(f)["model_type"]
    if model_type in ("diffllama", "llama"):
        return transformers_fns(folder, model_type)
    if model_type == "motif":
        m = mr.MotifModel.load(folder)
        e = mr.MotifModel(m.cfg, m.ckpt, bf16=True)
        return ((lambda ids: m.forward(ids, want_maps=False)["logits"][-1]),
                (lambda ids: e.forward(ids, want_maps=False)["logits"][-1]), "tools/motif_reference.py (float64 numpy)")
    if model_type == "phi4flash":
        m = pr.Phi4FlashModel.load(folder)
        e = pr.Phi4FlashModel.load(folder, bf16=True)
        return ((lambda ids: m.forward(ids, want_maps=False)["logits"][-1]),
                (lambda ids: e.forward(ids, want_maps=False)["logits"][-1]),
                "tools/phi4flash_reference.py (float64 numpy)")
    raise ValueError(f"{folder}: model_type {model_type!r} has no reference")


# --------------------------------------------------------------------------------------------------------------
# greedy generation by repeated full forwards
# --------------------------------------------------------------------------------------------------------------
def greedy(fn, prompt, steps):
    seq = [int(t) for t in prompt]
    logits, tokens, margins = [], [], []
    for _ in range(steps):
        lg = np.asarray(fn(seq), dtype=np.float64)  # the whole sequence again: no cache
        assert lg.ndim == 1 and np.all(np.isfinite(lg))
        top = int(np.argmax(lg))  # first (lowest) id among equal maxima
        rest = np.delete(lg, top)
        logits.append(lg)
        tokens.append(top)
        margins.append(float(lg[top] - rest.max()))
        seq.append(top)
    return np.stack(logits), np.asarray(tokens, dtype=np.int64), np.asarray(margins, dtype=np.float64)


def max_rel(a, ref):
    return float(np.max(np.abs(a - ref)) / np.max(np.abs(ref)))


def write_generate(folder, prompt, reference, fn, emu, check_logits=None):
    logits, tokens, margins = greedy(fn, prompt, G)
    steps = G
    while steps > 1 and 8 * len(prompt) + steps * (logits.shape[1] * 4 + 16) + 2048 > MAX_FILE_BYTES:
        steps -= 1  # too large a vocabulary: store fewer steps
    logits, tokens, margins = logits[:steps], tokens[:steps], margins[:steps]
    if check_logits is not None:  # the reference is the fixture's model: step 0 = expected.safetensors' last row
        err = max_rel(logits[0], check_logits)
        assert err < 1e-4, f"{folder}: step 0 logits differ from expected.safetensors' last row by {err:.2e}"
    else:
        err = None
    # The bf16 emulation along the reference's own sequence: its distance from float64 at each step.
    seq = [int(t) for t in prompt]
    bf16_err = []
    for g in range(steps):
        bf16_err.append(max_rel(np.asarray(emu(seq), dtype=np.float64), logits[g]))
        seq.append(int(tokens[g]))
    bf16_err = np.asarray(bf16_err)
    ties = [g for g in range(steps) if margins[g] < NEAR_TIE]
    meta = {"generator": "tests/gen_generation_fixtures.py", "reference": reference, "G": str(steps),
            "near_tie_threshold": f"{NEAR_TIE:g}", "near_tie_steps": ",".join(str(g) for g in ties),
            "first_near_tie": str(ties[0] if ties else -1), "min_margin": f"{float(margins.min()):.6g}"}
    path = os.path.join(folder, "generate.safetensors")
    write_safetensors(path, {"prompt_ids": np.asarray(prompt, dtype=np.int64), "generated": tokens,
                             "step_logits": logits.astype(np.float32), "margin": margins.astype(np.float32),
                             "bf16_err": bf16_err.astype(np.float32)}, meta)
    name = os.path.basename(folder)
    chk = f" step0-vs-expected {err:.1e}" if err is not None else ""
    print(f"{name}: n={len(prompt)} G={steps} tokens={tokens.tolist()} min margin {margins.min():.4f}"
          f" near-ties {ties or 'none'} bf16 emulation max {bf16_err.max():.1e}{chk}"
          f" size={os.path.getsize(path) / 1024:.1f} KiB")


# --------------------------------------------------------------------------------------------------------------
# the long-prompt fixture
# --------------------------------------------------------------------------------------------------------------
def make_long_fixture(out_root):
    torch = _torch()
    import gen_fixtures as gf
    from transformers import DiffLlamaConfig, DiffLlamaForCausalLM
    d = os.path.join(out_root, LONG_NAME)
    shutil.rmtree(d, ignore_errors=True)
    torch.manual_seed(LONG_SEED)
    theta = 10000.0
    cfg = DiffLlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=16, intermediate_size=64, vocab_size=256, tie_word_embeddings=True,
                          rope_parameters={"rope_type": "default", "rope_theta": theta}, rms_norm_eps=1e-5,
                          max_position_embeddings=2048, initializer_range=0.08, attn_implementation="eager",
                          bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg.lambda_std_dev = 0.3
    model = DiffLlamaForCausalLM._from_config(cfg, attn_implementation="eager").float().eval()
    with torch.no_grad():  # as tests/gen_fixtures.py: perturbed norms and lambda vectors so that wrong formulas show
        for pname, p in model.named_parameters():
            if pname.endswith("layernorm.weight") or pname == "model.norm.weight":
                p.copy_(1.0 + 0.25 * torch.randn_like(p))
            elif "lambda_" in pname:
                p.copy_(0.35 * torch.randn_like(p))
            elif pname.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(LONG_QK_GAIN)
    model.save_pretrained(d, safe_serialization=True)
    for extra in ("generation_config.json",):
        p = os.path.join(d, extra)
        if os.path.exists(p):
            os.remove(p)
    gf.rewrite_config(os.path.join(d, "config.json"), "v5", theta, None, "f32")
    rng = np.random.default_rng(LONG_SEED)
    ids = rng.integers(3, cfg.vocab_size, LONG_PROMPT).astype(np.int64)
    ids[0] = 1  # BOS
    return d, ids


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "fixtures")
    names = sorted(n for n in os.listdir(out) if os.path.exists(os.path.join(out, n, "expected.safetensors")))
    for name in names:
        d = os.path.join(out, name)
        ex = SafetensorsFile(os.path.join(d, "expected.safetensors"))
        prompt = ex.get("input_ids", np.int64)
        last = ex.get("logits")[-1]
        fn, emu, ref = reference_fns(d)
        write_generate(d, prompt, ref, fn, emu, check_logits=last)
    d, ids = make_long_fixture(out)
    fn, emu, ref = reference_fns(d)
    write_generate(d, ids, ref, fn, emu)
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    print(f"{LONG_NAME}: files={sorted(os.listdir(d))} size={size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
