"""HF DiffLlama (kajuma shape, bf16, sdpa) batch-1 greedy decoding with transformers' generate and its KV cache: the
peer of diffscope-bench --only decode. Per token = (time of generate with 1 + K new tokens - time with 1) / K, so
the prompt's prefill is not counted. Random weights (the shape is what matters for speed); K = 32."""
import json, os, sys, time, torch
from transformers import DiffLlamaConfig, DiffLlamaForCausalLM
OUT = os.environ.get("OUT", "/tmp"); dev = "cuda"; dt = torch.bfloat16; rows = []
K = int(os.environ.get("DS_PEER_DECODE_TOKENS", "32"))
cfg = DiffLlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
    num_attention_heads=32, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True, max_position_embeddings=131072,
    rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, rms_norm_eps=1e-5)
m = DiffLlamaForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=dt).to(dev).eval()
def gen_ms(ids, new):
    torch.cuda.synchronize(); t = time.perf_counter()
    with torch.no_grad():
        m.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize(); return (time.perf_counter() - t) * 1e3
for n in [int(x) for x in (sys.argv[1:] or ["1024", "8192", "32768"])]:
    torch.manual_seed(0)
    ids = torch.randint(0, 128256, (1, n), device=dev)
    gen_ms(ids, 2)  # warm-up (kernels, allocator)
    one = sorted(gen_ms(ids, 1) for _ in range(3))[1]
    many = sorted(gen_ms(ids, 1 + K) for _ in range(3))[1]
    r = {"name": "hf_diffllama_1.2B_generate[sdpa,greedy]", "prompt": n, "new_tokens": K,
         "ms_per_token": round((many - one) / K, 3), "tok_s": round(K / (many - one) * 1e3, 1)}
    rows.append(r); print(json.dumps(r), flush=True)
json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
          open(os.path.join(OUT, "peer_decode.json"), "w"), indent=1)
