#!/usr/bin/env bash
# A layer split's forward and decoding against one GPU (issue 47), on the device: the random kajuma checkpoint at a
# 32K-token prompt, diffscope-run --generate 64 --json on cuda:0 and on cuda:0,1 forced to split by --gpu-mem-limit,
# alternating, twice each; the generated tokens must be the same (the GEMM choice pinned, DS_GEMM_AUTOTUNE=0).
#   tools/split_decode_bench.sh RUN_EXE OUT_DIR [LIMIT] [TOKENS]
set -u
RUN=$1 OUT=$2 LIMIT=${3:-4G} N=${4:-32768}
[ -f /tmp/kajuma_rand/config.json ] || python3 tools/make_random_checkpoint.py /tmp/kajuma_rand > "$OUT/make_ckpt.log" 2>&1
python3 -c "import random; r=random.Random(3); print(','.join(str(r.randrange(8192)) for _ in range($N)))" > /tmp/split_ids.txt
for round in 1 2; do
  for which in single split; do
    args=(--backend cuda:0); [ $which = split ] && args=(--backend cuda:0,1 --gpu-mem-limit "$LIMIT")
    DS_GEMM_AUTOTUNE=0 "$RUN" --model /tmp/kajuma_rand --token-ids-file /tmp/split_ids.txt --generate 64 --ignore-eos \
      --json "${args[@]}" > "$OUT/split_decode_${which}_$round.json" 2> "$OUT/split_decode_${which}_$round.err"
    python3 - "$OUT/split_decode_${which}_$round.json" $which $round <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]:6} round {sys.argv[3]}: forward {d['forward_ms']:.1f} ms, {len(d['generated'])} tokens in "
      f"{d['generate_ms']:.1f} ms = {d['generate_ms'] / max(1, len(d['generated'])):.2f} ms/token; {d['backend'][:160]}")
PY
  done
done
python3 - "$OUT" <<'PY'
import json, sys
o = sys.argv[1]
a = [json.load(open(f"{o}/split_decode_single_{r}.json")) for r in (1, 2)]
b = [json.load(open(f"{o}/split_decode_split_{r}.json")) for r in (1, 2)]
f1, f2 = min(x["forward_ms"] for x in a), min(x["forward_ms"] for x in b)
g1 = min(x["generate_ms"] / len(x["generated"]) for x in a)
g2 = min(x["generate_ms"] / len(x["generated"]) for x in b)
print(f"split/single: forward {f2 / f1:.3f}x ({f2:.1f} vs {f1:.1f} ms), decoding {g2 / g1:.3f}x per token "
      f"({g2:.2f} vs {g1:.2f} ms); the same tokens: {a[0]['generated'] == b[0]['generated']}")
PY
