#!/usr/bin/env bash
# A layer split's forward and decoding against one GPU (issue 47), on the device: a random checkpoint (kajuma's shape,
# or FAMILY=motif2: Motif-2-12.7B's) at a 32K-token prompt, diffscope-run --generate 64 --json on cuda:0 and on
# SPLIT (cuda:0,1) forced to split by --gpu-mem-limit, alternating, twice each; the generated tokens must be the same
# (the GEMM choice pinned, DS_GEMM_AUTOTUNE=0). EXTRA_LIMIT=20G: once more on EXTRA_BACKEND (cuda:all; cuda:0,0 has one
# large GPU stand in for two cards) with that limit per GPU (the 24 GB-card case), printing the placement. ROUNDS=0:
# one GPU once, then only that run.
#   [FAMILY=motif2] [SPLIT=cuda:0,1] [EXTRA_LIMIT=20G] [EXTRA_BACKEND=cuda:0,0] [ROUNDS=2]
#     tools/split_decode_bench.sh RUN_EXE OUT_DIR [LIMIT] [TOKENS]
set -u
RUN=$1 OUT=$2 LIMIT=${3:-4G} N=${4:-32768}
FAMILY=${FAMILY:-diffllama} SPLIT=${SPLIT:-cuda:0,1}
MODEL=/tmp/kajuma_rand; [ "$FAMILY" = diffllama ] || MODEL=/tmp/${FAMILY}_rand
[ -f $MODEL/config.json ] || python3 tools/make_random_checkpoint.py $MODEL --family "$FAMILY" > "$OUT/make_ckpt_$FAMILY.log" 2>&1
python3 -c "import random; r=random.Random(3); print(','.join(str(r.randrange(8192)) for _ in range($N)))" > /tmp/split_ids.txt
ROUNDS=${ROUNDS:-2}
for round in $(seq 1 $((ROUNDS > 0 ? ROUNDS : 1))); do
  for which in single split; do
    [ "$ROUNDS" = 0 ] && [ $which = split ] && continue
    args=(--backend cuda:0); [ $which = split ] && args=(--backend "$SPLIT" --gpu-mem-limit "$LIMIT")
    DS_GEMM_AUTOTUNE=0 "$RUN" --model $MODEL --token-ids-file /tmp/split_ids.txt --generate 64 --ignore-eos \
      --json "${args[@]}" > "$OUT/split_decode_${which}_$round.json" 2> "$OUT/split_decode_${which}_$round.err"
    python3 - "$OUT/split_decode_${which}_$round.json" $which $round <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]:6} round {sys.argv[3]}: forward {d['forward_ms']:.1f} ms, {len(d['generated'])} tokens in "
      f"{d['generate_ms']:.1f} ms = {d['generate_ms'] / max(1, len(d['generated'])):.2f} ms/token; {d['backend'][:400]}")
PY
  done
done
# EXTRA_TOKENS: the limit run's prompt length when it differs (a 24 GB card's share may not hold 32K tokens' caches)
if [ -n "${EXTRA_LIMIT:-}" ]; then
  python3 -c "import random; r=random.Random(3); print(','.join(str(r.randrange(8192)) for _ in range(${EXTRA_TOKENS:-$N})))" > /tmp/split_ids_extra.txt
  DS_GEMM_AUTOTUNE=0 "$RUN" --model $MODEL --token-ids-file /tmp/split_ids_extra.txt --generate 64 --ignore-eos --json \
    --backend "${EXTRA_BACKEND:-cuda:all}" --gpu-mem-limit "$EXTRA_LIMIT" > "$OUT/split_decode_limit.json" 2> "$OUT/split_decode_limit.err"
  echo "${EXTRA_BACKEND:-cuda:all} --gpu-mem-limit $EXTRA_LIMIT, ${EXTRA_TOKENS:-$N} tokens: exit $?"
  grep -i "layer\|place\|GiB\|error" "$OUT/split_decode_limit.err" | head -12
  python3 - "$OUT/split_decode_limit.json" "$OUT/split_decode_single_1.json" <<'PY'
import json, sys
try:
    d, s = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
except Exception as e:
    sys.exit(f"no report: {e}")
same = d['generated'] == s['generated'] if d['tokens'] == s['tokens'] else 'another prompt length'
print(f"limit run: forward {d['forward_ms']:.1f} ms, {d['generate_ms'] / max(1, len(d['generated'])):.2f} ms/token, "
      f"the same tokens as one GPU: {same}; {d['backend']}")
PY
fi
[ "$ROUNDS" = 0 ] && exit 0
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
