"""Generate model fixtures with Hugging Face transformers' own DiffLlama and Llama.

Run where torch and transformers are installed (no network needed: random init, nothing downloaded):
    python3 tests/gen_fixtures.py OUT_DIR [--holdout]

Each fixture is a standard Hugging Face model directory (config.json + safetensors weights, sharded for one) plus
`expected.safetensors`, written from transformers' eager forward pass in float32:
    input_ids            [n] I64
    logits               [n, vocab] F32
    hidden.{l}           [n, hidden] F32   input of decoder layer l (l < L); hidden.{L} = output of the last layer
                                           (before the final norm)  -- recorded with forward hooks, so it does not
                                           depend on how a transformers version defines output_hidden_states
    layers.{l}.attn1/2   [H/2, n, n] F32   DiffLlama post-softmax maps (query heads j and j + H/2)
    layers.{l}.attn      [H, n, n]   F32   Llama
    layers.{l}.lambda    [1] F32           DiffLlama: lambda_full used by the layer
    override.lambda      [L] F32           DiffLlama: lambda values forced into every layer for a second run
    override.logits      [n, vocab] F32    logits of that run
    override.layers.{l}.attn1/2            maps of that run
The override run sets lambda_q1 . lambda_k1 = s, lambda_q2 = lambda_k2 = 0 so that transformers itself
computes exp(s) - 1 + lambda_init = the wanted value: the expected numbers come from transformers, not from us.
Weights are perturbed (norm weights, lambda vectors, larger init) so that a wrong formula shows in the outputs.
"""
import json, math, os, shutil, sys
import torch
from safetensors.torch import load_file, save_file
import transformers
from transformers import DiffLlamaConfig, DiffLlamaForCausalLM, LlamaConfig, LlamaForCausalLM

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

FIXTURES = {
    # name: (arch, config kwargs, extra)
    "diff_mha_d32_f32": ("diff", dict(hidden_size=128, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=8,
                         head_dim=32, intermediate_size=256, vocab_size=320, tie_word_embeddings=False,
                         rope_theta=10000.0), dict(n=37, spelling="v4", dtype="f32", seed=1)),
    "diff_gqa_d64_llama3_bf16_tied": ("diff", dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64, intermediate_size=192, vocab_size=288, tie_word_embeddings=True,
                         rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                         high_freq_factor=4.0, original_max_position_embeddings=16)),
                         dict(n=41, spelling="v4", dtype="bf16", seed=2)),
    "diff_gqa4_d32_sharded_v5": ("diff", dict(hidden_size=96, num_hidden_layers=3, num_attention_heads=8,
                         num_key_value_heads=4, head_dim=32, intermediate_size=160, vocab_size=256, tie_word_embeddings=False,
                         rope_theta=10000.0), dict(n=29, spelling="v5", dtype="f32", seed=3, shard="60KB")),
    "diff_n1": ("diff", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=32, intermediate_size=128, vocab_size=200, tie_word_embeddings=False, rope_theta=10000.0),
                         dict(n=1, spelling="v4", dtype="f32", seed=4)),
    "diff_llama3_f32": ("diff", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                         head_dim=32, intermediate_size=128, vocab_size=200, tie_word_embeddings=False, rope_theta=500000.0,
                         rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                         original_max_position_embeddings=16)), dict(n=45, spelling="v5", dtype="f32", seed=8)),
    "diff_bf16_default_rope": ("diff", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=32, intermediate_size=128, vocab_size=200, tie_word_embeddings=True, rope_theta=10000.0),
                         dict(n=31, spelling="v4", dtype="bf16", seed=9)),
    "llama_gqa_d32_f32": ("llama", dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=32, intermediate_size=256, vocab_size=300, tie_word_embeddings=False, rope_theta=10000.0),
                         dict(n=33, spelling="v4", dtype="f32", seed=5)),
    "llama_tied_llama3_bf16": ("llama", dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         head_dim=64, intermediate_size=192, vocab_size=270, tie_word_embeddings=True, rope_theta=500000.0,
                         rope_scaling=dict(rope_type="llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
                         original_max_position_embeddings=16)), dict(n=40, spelling="v5", dtype="bf16", seed=6)),
}
# A fixture the tests never read: a held-out check of diffscope-run --dump against it (tools/compare_dump.py).
HOLDOUT = {
    "holdout_diff_gqa_d64": ("diff", dict(hidden_size=160, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                         head_dim=64, intermediate_size=224, vocab_size=350, tie_word_embeddings=False, rope_theta=500000.0,
                         rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                         original_max_position_embeddings=32)), dict(n=53, spelling="v4", dtype="bf16", seed=77)),
}


def make_model(arch, kw, seed):
    torch.manual_seed(seed)
    common = dict(rms_norm_eps=1e-5, max_position_embeddings=256, initializer_range=0.08, attn_implementation="eager",
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    kw = dict(kw)
    rope_scaling = kw.pop("rope_scaling", None)
    theta = kw.pop("rope_theta")
    cfg_cls = DiffLlamaConfig if arch == "diff" else LlamaConfig
    try:  # transformers 5.x
        rp = {"rope_type": "default", "rope_theta": theta}
        if rope_scaling:
            rp.update(rope_scaling)
        cfg = cfg_cls(rope_parameters=rp, **common, **kw)
    except TypeError:
        cfg = cfg_cls(rope_theta=theta, rope_scaling=rope_scaling, **common, **kw)
    if arch == "diff":
        cfg.lambda_std_dev = 0.3
    cls = DiffLlamaForCausalLM if arch == "diff" else LlamaForCausalLM
    model = cls._from_config(cfg, attn_implementation="eager").float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.copy_(1.0 + 0.25 * torch.randn_like(p))
            elif "lambda_" in name:
                p.copy_(0.35 * torch.randn_like(p))
    return model, rope_scaling, theta


def round_params_to_bf16(model):
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())


def rewrite_config(path, spelling, theta, rope_scaling, dtype):
    """Write the config in the spelling a given transformers major version uses: 4.x rope_theta + rope_scaling, 5.x rope_parameters."""
    with open(path) as f:
        c = json.load(f)
    for k in ("rope_parameters", "rope_scaling", "rope_theta", "dtype", "torch_dtype"):
        c.pop(k, None)
    c["torch_dtype" if spelling == "v4" else "dtype"] = "bfloat16" if dtype == "bf16" else "float32"
    if spelling == "v4":
        c["rope_theta"] = theta
        c["rope_scaling"] = dict(rope_scaling) if rope_scaling else None
    else:
        rp = {"rope_theta": theta, "rope_type": "default"}
        if rope_scaling:
            rp.update(rope_scaling)
        c["rope_parameters"] = rp
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)


def set_override(model, values):
    for l, layer in enumerate(model.model.layers):
        at = layer.self_attn
        s1 = math.log(values[l] - at.lambda_init + 1.0)  # exp(s1) - exp(0) + lambda_init = value
        for p in (at.lambda_q1, at.lambda_k1, at.lambda_q2, at.lambda_k2):
            p.data.zero_()
        at.lambda_q1.data[0] = math.sqrt(abs(s1))
        at.lambda_k1.data[0] = math.copysign(math.sqrt(abs(s1)), s1)


def run(model, ids, arch, prefix=""):
    L = model.config.num_hidden_layers
    out, hidden = {}, {}
    hooks = []
    for l, layer in enumerate(model.model.layers):
        hooks.append(layer.register_forward_pre_hook(
            lambda m, args, kwargs, l=l: hidden.__setitem__(l, (args[0] if args else kwargs["hidden_states"]).detach()),
            with_kwargs=True))
    def last_hook(m, args, output):
        hidden[L] = (output[0] if isinstance(output, tuple) else output).detach()
    hooks.append(model.model.layers[-1].register_forward_hook(last_hook))
    with torch.no_grad():
        o = model(input_ids=ids[None], output_attentions=True, use_cache=False)
    for h in hooks:
        h.remove()
    n = ids.numel()
    out[prefix + "logits"] = o.logits[0].float().contiguous()
    if not prefix:
        for l in range(L + 1):
            out[f"hidden.{l}"] = hidden[l][0].float().contiguous()
    H = model.config.num_attention_heads
    for l, a in enumerate(o.attentions):
        a = a[0].float()
        assert a.shape == (H, n, n), a.shape
        if arch == "diff":
            out[f"{prefix}layers.{l}.attn1"] = a[: H // 2].contiguous()
            out[f"{prefix}layers.{l}.attn2"] = a[H // 2:].contiguous()
        else:
            out[f"{prefix}layers.{l}.attn"] = a.contiguous()
    return out


def lambdas(model):
    vals = []
    for layer in model.model.layers:
        at = layer.self_attn
        l1 = torch.exp(torch.sum(at.lambda_q1 * at.lambda_k1, dtype=torch.float32))
        l2 = torch.exp(torch.sum(at.lambda_q2 * at.lambda_k2, dtype=torch.float32))
        vals.append(float((l1 - l2).detach()) + at.lambda_init)
    return vals


def make(out_root, name, spec):
    arch, kw, ex = spec
    d = os.path.join(out_root, name)
    shutil.rmtree(d, ignore_errors=True)
    model, rope_scaling, theta = make_model(arch, kw, ex["seed"])
    if ex["dtype"] == "bf16":  # stored as bf16; the reference runs on exactly those values, upcast to f32
        round_params_to_bf16(model)
    save_kw = {"safe_serialization": True}
    if "shard" in ex:
        save_kw["max_shard_size"] = ex["shard"]
    model.save_pretrained(d, **save_kw)
    if ex["dtype"] == "bf16":
        # Convert the written files, not the module: Module.to(bf16) would also round the rotary inv_freq buffers
        # of the reference model. The values are already bf16-exact (round_params_to_bf16), so nothing changes.
        for f in os.listdir(d):
            if f.endswith(".safetensors"):
                t = load_file(os.path.join(d, f))
                save_file({k: v.to(torch.bfloat16).contiguous() for k, v in t.items()}, os.path.join(d, f),
                          metadata={"format": "pt"})
    for extra in ("generation_config.json",):
        p = os.path.join(d, extra)
        if os.path.exists(p):
            os.remove(p)
    rewrite_config(os.path.join(d, "config.json"), ex["spelling"], theta, rope_scaling, ex["dtype"])
    g = torch.Generator().manual_seed(ex["seed"] + 1000)
    ids = torch.randint(3, kw["vocab_size"], (ex["n"],), generator=g)
    ids[0] = 1  # BOS
    exp = {"input_ids": ids.to(torch.int64), "rope.inv_freq": model.model.rotary_emb.inv_freq.float().clone()}
    exp.update(run(model, ids, arch))
    if arch == "diff":
        exp.update({f"layers.{l}.lambda": torch.tensor([v], dtype=torch.float32) for l, v in enumerate(lambdas(model))})
        L = model.config.num_hidden_layers
        ov = [0.0 if l == 0 else 0.9 + 0.37 * l for l in range(L)]  # lambda=0 is plain softmax attention
        set_override(model, ov)
        got = lambdas(model)
        assert max(abs(a - b) for a, b in zip(got, ov)) < 1e-5, (got, ov)
        exp["override.lambda"] = torch.tensor(ov, dtype=torch.float32)
        exp.update(run(model, ids, arch, prefix="override."))
    save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(d, "expected.safetensors"),
              metadata={"generator": "tests/gen_fixtures.py", "transformers": transformers.__version__,
                        "torch": torch.__version__})
    # The files must describe the model that made the expected outputs: reload them as a user would.
    cls = DiffLlamaForCausalLM if arch == "diff" else LlamaForCausalLM
    back = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        lg = back(input_ids=ids[None], use_cache=False).logits[0]
    err = float((lg - exp["logits"]).norm() / exp["logits"].norm())
    assert err < 1e-6, f"{name}: reloaded model disagrees with the reference run ({err})"
    print(f"{name}: n={ex['n']} reload-check {err:.1e} files={sorted(os.listdir(d))[:4]}")


if __name__ == "__main__":
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    specs = HOLDOUT if "--holdout" in sys.argv else FIXTURES
    for name, spec in specs.items():
        make(out, name, spec)
