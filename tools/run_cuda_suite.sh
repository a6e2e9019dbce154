#!/usr/bin/env bash
# The CUDA suite in one call on a GPU machine: environment, CUDA tests (kernels vs float64, model vs the
# transformers fixtures), compute-sanitizer memcheck + racecheck on the kernel tests, SASS checks of the fused
# kernel, the diffscope CUDA benchmarks, the PyTorch peers (bench/peers/) in the same run, and a comparison table.
#
#   tools/run_cuda_suite.sh pack              (here, on the build machine) build build-cuda and pack the binaries
#                                             plus the non-system shared libraries into .dev/cuda_suite.tar.xz
#   tools/run_cuda_suite.sh [STAGE...]        (on the GPU machine, repo root) stages: env tests sanitize sass bench
#                                             peers compare soak; default: all. Results and logs go to $OUT.
#                                             scan: corpus scans alone (device row masses, memcheck,
#                                             diffscope-scan on the demo pair, diffscope-bench --only scan).
#                                             gen: generation alone (decode kernel and engine tests, memcheck on
#                                             them, diffscope-bench --only decode/decode_attn, peer_decode.py).
#                                             Not in the default: views and peers_views (long prompts through the
#                                             map queries, and their transformers peers), peers_attn (FD1/FD2 at
#                                             d = 128 and 64), ncu,
#                                             bench_noautotune, bench_prev (the attention benchmark of the
#                                             binary packed from PREV_COMMIT, alternating with this one), python
#                                             (the module's pytest suite; pack with PY_MODULE_DIR, see there) and
#                                             python_bench (bench/python_api_bench.py), importance_bench
#                                             (bench/head_importance_bench.py), scan_gpus (bench/scan_gpus.py:
#                                             diffscope-scan on one GPU against cuda:all), split (the layer
#                                             split against one GPU: tests, and a forced split's forward time),
#                                             residual (bench/residual_bench.py: the lens, the outlier statistics
#                                             and quantised logits against the forward).
# Without .dev/cuda_suite.tar.xz the GPU machine builds with cmake (needs the -dev packages CMakeLists.txt lists).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-/tmp/cuda_suite_out}
mkdir -p "$OUT"
PACK=${PACK:-.dev/cuda_suite.tar.xz}  # PACK=... names another (two packs side by side)
DS=/tmp/ds_suite
SUMMARY=$OUT/summary.md

if [ "${1:-}" = pack ]; then
  set -e
  B=${BUILD_DIR:-build-cuda}  # BUILD_DIR=build reuses the main build
  [ -f "$B/CMakeCache.txt" ] || cmake -S . -B "$B" -G Ninja -DDS_ENABLE_CUDA=ON -DDS_BUILD_GUI=OFF -DCMAKE_CUDA_STANDARD=17 >/dev/null
  ninja -C "$B" diffscope_tests diffscope-bench diffscope-run diffscope-scan
  rm -rf /tmp/ds_pack && mkdir -p /tmp/ds_pack/bin /tmp/ds_pack/lib /tmp/ds_pack/obj
  cp "$B"/diffscope_tests "$B"/diffscope-bench "$B"/diffscope-run "$B"/diffscope-scan /tmp/ds_pack/bin/
  find "$B" \( -name 'diff_attn_fwd*.cu.o' -o -name 'attn_fwd_sm90*.cu.o' \) -exec cp {} /tmp/ds_pack/obj/ \;
  # The previous commit's benchmark, for an A/B of the attention kernels in one run (bench_prev).
  if [ -n "${PREV_BUILD:-}" ] && [ -x "$PREV_BUILD/diffscope-bench" ]; then
    cp "$PREV_BUILD/diffscope-bench" /tmp/ds_pack/bin/diffscope-bench-prev
    git -C "$PREV_BUILD/.." rev-parse --short HEAD > /tmp/ds_pack/bin/COMMIT_PREV 2>/dev/null || true
  fi
  # PACK_ONLY="a b": only these binaries (the device's carry is 64 MiB with the tree); STRIP=1 strips them.
  if [ -n "${PACK_ONLY:-}" ]; then
    for f in /tmp/ds_pack/bin/*; do
      case " $PACK_ONLY COMMIT COMMIT_PREV " in *" $(basename "$f") "*) ;; *) rm -f "$f";; esac
    done
  fi
  [ "${STRIP:-0}" = 1 ] && strip /tmp/ds_pack/bin/diffscope* 2>/dev/null
  [ "${NO_OBJ:-0}" = 1 ] && rm -f /tmp/ds_pack/obj/*  # NO_OBJ=1: no SASS stage (the objects are MBs of the carry)
  # PY_MODULE_DIR=DIR: the Python package with its native part built for the GPU machine's Python
  # (tools/build_py_module_for.sh), for the python stage.
  if [ -n "${PY_MODULE_DIR:-}" ]; then
    mkdir -p /tmp/ds_pack/python && cp -r "$PY_MODULE_DIR" /tmp/ds_pack/python/diffscope
  fi
  # OpenBLAS and its Fortran runtime (5 MB of the 64 MiB carry limit) only serve the CPU backend, which the GPU
  # machine runs on tiny fixtures alone: tools/cblas_standin.c takes their place.
  gcc -O2 -shared -fPIC -o /tmp/ds_pack/lib/libopenblas.so.0 -Wl,-soname,libopenblas.so.0 tools/cblas_standin.c
  for lib in $(ldd "$B"/diffscope_tests "$B"/diffscope-scan | awk '/=>/ {print $3}' | sort -u); do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libcuda.so*|libcudart*|libcublas*) ;;
      libopenblas*|libgfortran*|libquadmath*) ;;
      *) cp -L "$lib" /tmp/ds_pack/lib/ ;;
    esac
  done
  git rev-parse --short HEAD > /tmp/ds_pack/bin/COMMIT  # the GPU machine's copy of .git may be older
  mkdir -p .dev && tar -C /tmp/ds_pack -cJf "$PACK" bin lib obj $([ -d /tmp/ds_pack/python ] && echo python)
  ls -la "$PACK"
  exit 0
fi

STAGES=${*:-env tests sanitize sass bench peers compare soak}
has() { case " $STAGES " in *" $1 "*) return 0;; esac; return 1; }
log() { echo "$*" | tee -a "$SUMMARY"; }
: > "$SUMMARY"
export NCCL_NVLS_ENABLE=0
export PYTHONUNBUFFERED=1

# --- binaries ---------------------------------------------------------------------------------------------------
rm -rf "$DS" && mkdir -p "$DS"
if [ -f "$PACK" ]; then
  tar -C "$DS" -xJf "$PACK"
  CUDALIB=""
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
           $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cu13", "lib") for p in nvidia.__path__))' 2>/dev/null); do
    [ -d "$d" ] && CUDALIB="$CUDALIB:$d"
  done
  export LD_LIBRARY_PATH="$DS/lib$CUDALIB:${LD_LIBRARY_PATH:-}"
  if ldd "$DS/bin/diffscope_tests" | grep -q "not found"; then
    log "carried binaries miss libraries:"; ldd "$DS/bin/diffscope_tests" | grep "not found" | tee -a "$SUMMARY"
  fi
else
  log "no $PACK: building here"
  cmake -S . -B /tmp/ds_build -G Ninja -DDS_ENABLE_CUDA=ON -DDS_BUILD_GUI=OFF -DCMAKE_CUDA_STANDARD=17 >"$OUT/build.log" 2>&1 &&
    ninja -C /tmp/ds_build diffscope_tests diffscope-bench >>"$OUT/build.log" 2>&1 || { log "build failed"; tail -30 "$OUT/build.log"; }
  mkdir -p "$DS/bin" "$DS/obj" && cp /tmp/ds_build/diffscope_tests /tmp/ds_build/diffscope-bench "$DS/bin/" 2>/dev/null
  find /tmp/ds_build \( -name 'diff_attn_fwd.cu.o' -o -name 'attn_fwd_sm90.cu.o' \) -exec cp {} "$DS/obj/" \;
fi
# PY_PACK=FILE: a second pack with only python/ (the module, tools/build_py_module_for.sh), beside a binaries pack.
[ -n "${PY_PACK:-}" ] && [ -f "$PY_PACK" ] && mkdir -p "$DS/python" && tar -C "$DS/python" -xJf "$PY_PACK"
export DS_SOURCE_DIR="$ROOT" DS_BINARY_DIR="$DS"
T="$DS/bin/diffscope_tests"
CUDA_FILTER='CudaKernels.*:Impl/FusedAttention.*:AttnDispatch.*:CudaModel.*:Fixtures/FixtureCuda.*:AttnDecode*:Gemv*:GenerateCuda.*:*GenerateReferenceCuda.*:ScanRowMassCuda.*:ForwardHooks.*:EnvSwitch.*'

if has env; then
  log "## environment ($(date -u +%FT%TZ))"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 | tee -a "$SUMMARY"
  log "binaries built from commit: $(cat "$DS/bin/COMMIT" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)"
fi

if has tests; then
  log "## CUDA tests"
  timeout 420 "$T" --gtest_filter="$CUDA_FILTER" --gtest_output=json:"$OUT/cuda_tests.json" >"$OUT/tests.log" 2>&1
  log "exit $?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran|NOTE" "$OUT/tests.log" | tee -a "$SUMMARY"
  grep -B2 -A6 "Failure" "$OUT/tests.log" | head -80 | tee -a "$SUMMARY"
fi

# Layers across GPUs (issue 47): the split against one GPU on the engine's tests (DS_GEMM_AUTOTUNE=0 pins the GEMM
# choice per device), then a forced split of the random kajuma checkpoint (--gpu-mem-limit) through diffscope-scan at
# 32K tokens against one GPU: forward time and identical reports (bench/scan_gpus.py).
if has split; then
  log "## Layer split across GPUs"
  DS_GEMM_AUTOTUNE=0 timeout 300 "$T" --gtest_filter='SplitBackend*' >"$OUT/split_tests.log" 2>&1
  log "exit $?"; grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) |Failure|tests ran" "$OUT/split_tests.log" | head -20 | tee -a "$SUMMARY"
  grep -A8 "Failure" "$OUT/split_tests.log" | head -40 | tee -a "$SUMMARY"
  [ -f /tmp/kajuma_rand/config.json ] || python3 tools/make_random_checkpoint.py /tmp/kajuma_rand > "$OUT/make_ckpt.log" 2>&1
  timeout 300 python3 bench/scan_gpus.py --scan "$DS/bin/diffscope-scan" --model /tmp/kajuma_rand --lengths ${SPLIT_LENGTHS:-32768} \
    --prompts ${SPLIT_PROMPTS:-24} --multi cuda:0,1 --multi-args "--gpu-mem-limit ${SPLIT_LIMIT:-2G}" --json "$OUT/split_scan.json" 2>&1 |
    tail -8 | tee -a "$SUMMARY"
fi

# The Python module (pack with PY_MODULE_DIR): its pytest suite with the GPU tests, on this machine's Python (torch
# and CuPy are the DLPack consumers), then the API benchmark against the same calls in C++ and the transformers peer.
if has python; then
  log "## Python module: pytest"
  PYTHONPATH="$DS/python" DS_BINARY_DIR="$DS/bin" MPLBACKEND=Agg timeout 400 \
    python3 -m pytest -q -rs -p no:cacheprovider python/tests >"$OUT/pytest.log" 2>&1
  log "exit $?"; grep -E "passed|failed|SKIPPED|Error|FAILED" "$OUT/pytest.log" | tail -25 | tee -a "$SUMMARY"
fi
# memcheck on the module's device paths (the map queries writing into memory the caller owns).
if has python_sanitize; then
  log "## Python module under compute-sanitizer memcheck (device arrays)"
  PYTHONPATH="$DS/python" DS_BINARY_DIR="$DS/bin" timeout 400 compute-sanitizer --tool memcheck --print-limit 20 \
    python3 -m pytest -q -rs -p no:cacheprovider python/tests/test_cuda.py python/tests/test_interventions.py \
    -k "device or matches_cpu or cuda_head_scale" \
    >"$OUT/pytest_memcheck.log" 2>&1
  log "exit $?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/pytest_memcheck.log" | tail -5 | tee -a "$SUMMARY"
fi
if has importance_bench; then
  log "## Head importance against the transformers hook loop"
  PYTHONPATH="$DS/python" timeout 400 python3 bench/head_importance_bench.py --backend cuda --bench "$DS/bin/diffscope-bench" \
    --json "$OUT/head_importance_bench.json" 2>&1 | tee "$OUT/importance_bench.log" | tail -12 | tee -a "$SUMMARY"
fi
# Scans on every GPU (issue 47): diffscope-scan on one GPU against cuda:all on a random kajuma-shaped checkpoint, and
# the reports compared (bench/scan_gpus.py), and cuda:all again with the replicas' length-bucket queue off
# (DS_SCAN_IN_ORDER=1, --in-order-too). SCAN_GPUS_ARGS adds to its arguments.
if has scan_gpus; then
  log "## Corpus scans on every GPU"
  nvidia-smi -L | tee -a "$SUMMARY"
  for multi in cuda:0,0 cuda:all; do  # the demo model first: two replicas on one GPU, then one per GPU
    timeout 200 python3 bench/scan_gpus.py --scan "$DS/bin/diffscope-scan" --model assets/models/diffllama-demo \
      --lengths 1024 --prompts 48 --multi "$multi" --json "$OUT/scan_gpus_demo_${multi//[:,]/_}.json" 2>&1 | tail -2 | tee -a "$SUMMARY"
  done
  [ -f /tmp/kajuma_rand/config.json ] || python3 tools/make_random_checkpoint.py /tmp/kajuma_rand > "$OUT/make_ckpt.log" 2>&1
  timeout 560 python3 bench/scan_gpus.py --scan "$DS/bin/diffscope-scan" --model /tmp/kajuma_rand \
    --in-order-too --json "$OUT/scan_gpus.json" ${SCAN_GPUS_ARGS:-} 2>&1 | tee "$OUT/scan_gpus.log" | tail -12 | tee -a "$SUMMARY"
fi
# Issue 46's residual-stream costs (bench/residual_bench.py): the lens, the outlier statistics and quantised logits
# against the forward, on a random kajuma-shaped checkpoint. RESIDUAL_ARGS adds to its arguments.
if has residual; then
  log "## Lens, outliers and quantised logits against the forward"
  [ -f /tmp/kajuma_rand/config.json ] || python3 tools/make_random_checkpoint.py /tmp/kajuma_rand > "$OUT/make_ckpt.log" 2>&1
  PYTHONPATH="$DS/python" timeout 400 python3 bench/residual_bench.py --model /tmp/kajuma_rand \
    --json "$OUT/residual_bench.json" ${RESIDUAL_ARGS:-} 2>&1 | tee "$OUT/residual_bench.log" | tail -12 | tee -a "$SUMMARY"
fi
if has python_bench; then
  log "## Python API benchmark"
  PYTHONPATH="$DS/python" timeout 300 python3 bench/python_api_bench.py --backend cuda --bench "$DS/bin/diffscope-bench" \
    --json "$OUT/python_api_bench.json" ${PY_BENCH_ARGS:-} 2>&1 | tee "$OUT/python_bench.log" | tail -30 | tee -a "$SUMMARY"
fi

if has bench; then
  log "## diffscope CUDA benchmarks"
  timeout 480 "$DS/bin/diffscope-bench" --backend cuda --json "$OUT/cuda_bench.json" 2>&1 | tee "$OUT/bench.log" | tail -70
  tail -60 "$OUT/bench.log" >> "$SUMMARY"
fi

# The whole-model benchmark again with the GEMMs on cuBLASLt's first heuristic choice (no autotuning): what the
# timing of candidates buys. Rows go to cuda_bench_noautotune.json.
if has bench_noautotune; then
  log "## model benchmark with DS_GEMM_AUTOTUNE=0"
  DS_GEMM_AUTOTUNE=0 timeout 200 "$DS/bin/diffscope-bench" --backend cuda --only model --json "$OUT/cuda_bench_noautotune.json" 2>&1 | tail -6 | tee -a "$SUMMARY"
fi

# The attention benchmark of the previous commit's binary and of this one, alternating (prev, this, prev, this):
# "behaviour and speed unchanged" measured in one run. Rows go to cuda_bench_prev.json as {"runs": [...]}.
if has bench_prev && [ -x "$DS/bin/diffscope-bench-prev" ]; then
  log "## attention: previous commit vs this one, alternating"
  for i in 1 2; do
    for who in prev this; do
      b="$DS/bin/diffscope-bench"; [ $who = prev ] && b="$DS/bin/diffscope-bench-prev"
      timeout 150 "$b" --backend cuda --only attention --json "$OUT/attn_${who}_$i.json" >/dev/null 2>&1
      log "$who #$i exit $?"
    done
  done
  python3 - "$OUT" <<'PY' | tee -a "$SUMMARY"
import json, os, sys, glob
out = sys.argv[1]; runs = []
for f in sorted(glob.glob(os.path.join(out, "attn_*_*.json"))):
    who, i = os.path.basename(f)[5:-5].split("_")
    c = json.load(open(f)); c = c.get("cuda", c)
    for r in c.get("attention", []):
        runs.append({"who": who, "run": int(i), "kernel": r.get("kernel"), "d": r["d"], "n": r["n"], "batch": r["batch"], "tok_s": r["tok_s"], "tflops": r["tflops"]})
    os.remove(f)
json.dump({"runs": runs}, open(os.path.join(out, "cuda_bench_prev.json"), "w"), indent=1)
def best(who, kern_pred, d, n):
    v = [r["tok_s"] for r in runs if r["who"] == who and kern_pred(r["kernel"] or "") and r["d"] == d and r["n"] == n]
    return max(v) if v else None
print("| kernel | d | n | prev (best of 2) | this (best of 2) | this/prev |"); print("|---|---|---|---|---|---|")
# 71df40a's rows: "sm90a wgmma", "sm90a wgmma bn128", "mma.sync"; this commit's: "wgmma (default)" (128-key tiles at
# d = 64), "mma-both", "mma-vsplit", "mma-lockstep". The mma.sync rows compare the schedule each binary ran.
for label, pp, pt in [("wgmma (128-key tiles at d=64)", lambda k: "wgmma" in k and ("bn128" in k or d == 128), lambda k: k.startswith("wgmma")),
                      ("mma.sync", lambda k: k == "mma.sync", lambda k: k.startswith("mma-both" if d == 64 else "mma-vsplit"))]:
    for d in (128, 64):
        for n in (2048, 4096, 8192, 16384):
            a, b = best("prev", pp, d, n), best("this", pt, d, n)
            if a and b: print(f"| {label} | {d} | {n} | {a/1e6:.2f} M | {b/1e6:.2f} M | {b/a:.3f} |")
PY
fi

# Nsight Compute on one launch of the default wgmma kernel at d = 128, 2048 x 8 (the 4th launch), sections plus the
# per-reason stall metrics. (Selecting a later shape by --launch-skip did not work: it still met a 2048 x 8 launch.)
if has ncu; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for spec in "2048x8 3"; do
    set -- $spec
    log "## ncu: attn_fwd_sm90, d = 128, $1"
    timeout 200 "$NCU" --clock-control none -k regex:attn_fwd_sm90 --launch-skip "$2" --launch-count 1 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
      --section LaunchStats --section Occupancy --section SchedulerStats \
      --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio \
      "$DS/bin/diffscope-bench" --backend cuda --only attention --attn-kernel auto --warmup-ms 0 --repeat 1 >"$OUT/ncu_$1.txt" 2>&1
    log "ncu exit $?"
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Issued Ipc|L2 Hit|Executed Ipc|Registers|Warp Cycles Per Issued|No Eligible|Eligible Warps|Active Warps Per|Pipe|smsp__average_warps_issue_stalled" "$OUT/ncu_$1.txt" \
      | grep -vE "stalled_[a-z_]+_per_issue_active\.ratio +[a-z/]* +0(\.0+)?$" | head -60 | tee -a "$SUMMARY"
  done
fi

# The attention peers alone (FlashDiffAttn_1 on cuDNN, _2 on SDPA flash; peer_baseline.py's definitions), at
# d = 128 x 12 and d = 64 x 16 differential heads: peer_attn.json.
if has peers_attn; then
  log "## PyTorch attention peers (d = 128 and 64)"
  timeout 240 python3 - "$OUT" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, os, sys, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
out = sys.argv[1]; dev = "cuda"; dt = torch.bfloat16
def bench(fn, iters=20, warm=3, warm_s=float(os.environ.get("DS_BENCH_WARMUP_MS", "1000")) / 1e3):
    import time
    t0 = time.perf_counter(); k = 0
    while k < warm or time.perf_counter() - t0 < warm_s:  # steady state, as diffscope-bench's time_events
        fn(); k += 1
        if k % 8 == 0: torch.cuda.synchronize()
    torch.cuda.synchronize(); ts = []
    for _ in range(iters):
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    ts.sort(); return ts[len(ts) // 2]
rows = []
for H, D in [(12, 128), (16, 64)]:
    for n, B in [(2048, 8), (4096, 4), (8192, 2), (16384, 1)]:
        torch.manual_seed(0)
        q1, q2, k1, k2 = [torch.randn(B, H, n, D, device=dev, dtype=dt) for _ in range(4)]
        v = torch.randn(B, H, n, 2 * D, device=dev, dtype=dt); v1, v2 = v[..., :D].contiguous(), v[..., D:].contiguous()
        lam = 0.8; s = F.scaled_dot_product_attention
        for bk, name in [(SDPBackend.CUDNN_ATTENTION, "flashdiff1[CUDNN_ATTENTION]"), (SDPBackend.FLASH_ATTENTION, "flashdiff2[FLASH_ATTENTION]")]:
            try:
                with sdpa_kernel(bk):
                    if name.startswith("flashdiff1"):
                        f = lambda: s(q1, k1, v, is_causal=True) - lam * s(q2, k2, v, is_causal=True)
                    else:
                        f = lambda: torch.cat([s(q1, k1, v1, is_causal=True), s(q1, k1, v2, is_causal=True)], -1) - lam * torch.cat([s(q2, k2, v1, is_causal=True), s(q2, k2, v2, is_causal=True)], -1)
                    ms = bench(f)
                r = {"name": name, "d": D, "heads": H, "n": n, "B": B, "ms": round(ms, 4), "tok_s": round(B * n / ms * 1e3), "tflops": round(12 * n * n * D / 2 * H * B / ms / 1e9, 1)}
                rows.append(r); print(json.dumps(r), flush=True)
            except Exception as ex:
                print(name, D, n, "FAILED", str(ex).splitlines()[0][:120])
        del q1, q2, k1, k2, v, v1, v2; torch.cuda.empty_cache()
json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, open(os.path.join(out, "peer_attn.json"), "w"), indent=1)
PY
fi

if has peers; then
  log "## PyTorch peers"
  timeout 300 python3 bench/peers/peer_baseline.py >"$OUT/peers.log" 2>&1; log "peer_baseline exit $?"
  timeout 200 python3 bench/peers/peer_model_keep1.py >>"$OUT/peers.log" 2>&1; log "peer_model_keep1 exit $?"
  timeout 300 python3 bench/peers/peer_table7.py >>"$OUT/peers.log" 2>&1; log "peer_table7 exit $?"
fi

if has compare; then
  python3 - "$OUT" <<'PY' | tee -a "$SUMMARY"
import json, os, sys
out = sys.argv[1]
def load(n):
    p = os.path.join(out, n)
    return json.load(open(p)) if os.path.exists(p) else None
ours, peer, keep1 = load("cuda_bench.json"), load("peer_baseline.json"), load("peer_model_keep1.json")
if not ours:
    print("no cuda_bench.json"); sys.exit()
c = ours.get("cuda", ours)
print(f"\n### attention, tokens/s (device {c.get('device')}, GEMM peak {c.get('gemm_bf16_tflops', 0):.0f} TFLOP/s)")
print("| kernel | d x heads | n x batch | diffscope fused | TFLOP/s | FD2 flash | FD1 cuDNN | std attn cuDNN | vs FD2 | vs FD1 |")
print("|---|---|---|---|---|---|---|---|---|---|")
prow = {}
for r in (peer or {}).get("rows", []):
    prow[(r["name"], r["n"])] = r["tok_s"]
pattn = load("peer_attn.json")
prow_d = {(r["name"], r["n"], r["d"]): r["tok_s"] for r in (pattn or {}).get("rows", [])}
for r in c.get("attention", []):
    n, d = r["n"], r["d"]
    if prow_d:
        fd2 = prow_d.get(("flashdiff2[FLASH_ATTENTION]", n, d)); fd1 = prow_d.get(("flashdiff1[CUDNN_ATTENTION]", n, d)); std = None
    elif d == 128:
        fd2 = prow.get(("flashdiff2[FLASH_ATTENTION]", n)); fd1 = prow.get(("flashdiff1[CUDNN_ATTENTION]", n)); std = prow.get(("std_attn_2h[CUDNN_ATTENTION]", n))
    else:
        fd2 = fd1 = std = None
    f = lambda x: f"{x/1e6:.2f} M" if x else "-"
    g = lambda x: f"{r['tok_s']/x:.2f}x" if x else "-"
    print(f"| {r.get('kernel', '')} | {d} x {r['diff_heads']} | {n} x {r['batch']} | {f(r['tok_s'])} | {r['tflops']:.0f} | {f(fd2)} | {f(fd1)} | {f(std)} | {g(fd2)} | {g(fd1)} |")
print("\n### model prefill, next-token logits (kajuma shape, bf16)")
print("| n x batch | diffscope ms | HF sdpa logits_to_keep=1 ms | speed-up |")
print("|---|---|---|---|")
k = {(r["n"], r.get("B")): r["ms"] for r in (keep1 or {}).get("rows", []) if "prefill" in r["name"]}
for r in c.get("model", []):
    hf = k.get((r["n"], r["batch"]))
    print(f"| {r['n']} x {r['batch']} | {r['ms']:.2f} | {hf if hf else '-'} | {f'{hf / r['ms']:.2f}x' if hf else '-'} |")
for r in c.get("model", []):
    if r.get("kernels"):
        print(f"  {r['n']} x {r['batch']} per kernel (profiled run, ms): " +
              ", ".join(f"{k['name']} {k['total_ms']:.2f}" for k in r["kernels"]))
t7, p7 = c.get("table7"), (load("peer_table7.json") or {}).get("table7")
if t7:
    print(f"\n### Table 7: 3B DIFF vs its Transformer twin, forward tokens/s (next-token logits; {t7.get('assumed', '')})")
    print("| n x batch | diffscope DIFF | diffscope Transformer | DIFF/Transformer | transformers DIFF | transformers Transformer | ratio | diffscope/transformers (DIFF, Transformer) | paper DIFF / Transformer (ratio) |")
    print("|---|---|---|---|---|---|---|---|---|")
    prows = {(r["n"], r["batch"]): r for r in (p7 or {}).get("rows", [])}
    for r in t7.get("rows", []):
        p = prows.get((r["n"], r["batch"]), {})
        f = lambda x: f"{x:,.0f}" if x else "-"
        sp = f"{r['diff_tok_s'] / p['diff_tok_s']:.2f}x, {r['transformer_tok_s'] / p['transformer_tok_s']:.2f}x" if p else "-"
        print(f"| {r['n']} x {r['batch']} | {f(r['diff_tok_s'])} | {f(r['transformer_tok_s'])} | {r['ratio']:.3f} | "
              f"{f(p.get('diff_tok_s'))} | {f(p.get('transformer_tok_s'))} | {p.get('ratio', 0):.3f} | {sp} | "
              f"{f(r.get('paper_diff_tok_s'))} / {f(r.get('paper_transformer_tok_s'))} ({r.get('paper_ratio', 0):.3f}) |")
lam = c.get("lambda")
if lam:
    print(f"\nlambda change (n={lam['n']}, from layer {lam['from_layer']}): forward {lam['forward_ms']:.2f} ms, "
          f"+ GPU stats + probs {lam['forward_stats_probs_ms']:.2f} ms, + all maps to host {lam['forward_maps_to_host_probs_ms']:.2f} ms")
PY
fi

if has sass; then
  log "## SASS of the fused kernel"
  for o in "$DS"/obj/*.o; do
    cuobjdump -sass "$o" > "$OUT/sass.txt" 2>&1 || true
    awk '/Function :/ {f=$3} /HMMA|HGMMA/ {h[f]++} /LDL|STL/ {l[f]++} /LDSM/ {m[f]++} /UTMALDG/ {t[f]++} END {for (k in h) printf "%s: (H)MMA/HGMMA %d, LDSM %d, TMA loads %d, local ld/st %d\n", k, h[k], m[k], t[k]+0, l[k]+0}' "$OUT/sass.txt" | tee -a "$SUMMARY"
    gzip -f "$OUT/sass.txt"
  done
fi

if has gen; then
  log "## generation: decode kernel and engine tests, memcheck, benchmark, transformers generate"
  timeout 300 "$T" --gtest_filter='AttnDecode*:Gemv*:GenerateCuda.*:*GenerateReferenceCuda.*' >"$OUT/gen_tests.log" 2>&1
  log "exit $?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran" "$OUT/gen_tests.log" | tee -a "$SUMMARY"
  grep -B2 -A8 "Failure" "$OUT/gen_tests.log" | head -60 | tee -a "$SUMMARY"
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  DS_CUDA_TEST_SMALL=1 timeout 200 "$CS" --tool memcheck --error-exitcode 9 "$T" \
    --gtest_filter='AttnDecode*:Gemv*:GenerateCuda.GraphReplays*:GenerateCuda.ArgmaxKernel*:GenerateCuda.DeviceGreedy*:CudaKernels.Mamba*' >"$OUT/gen_memcheck.log" 2>&1
  log "memcheck exit $?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/gen_memcheck.log" | tail -3 | tee -a "$SUMMARY"
  timeout 300 "$DS/bin/diffscope-bench" --backend cuda --only decode_attn --only decode --json "$OUT/decode_bench.json" \
    2>&1 | tee "$OUT/decode_bench.log" | tail -20 | tee -a "$SUMMARY"
  OUT="$OUT" timeout 240 python3 bench/peers/peer_decode.py 1024 8192 32768 2>&1 | tail -5 | tee -a "$SUMMARY"
fi

if has scan; then
  log "## corpus scans: device row masses against the rows, memcheck, diffscope-scan on the demo pair, benchmark"
  timeout 200 "$T" --gtest_filter='ScanRowMassCuda.*' >"$OUT/scan_tests.log" 2>&1
  log "exit $?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran" "$OUT/scan_tests.log" | tee -a "$SUMMARY"
  grep -B2 -A8 "Failure" "$OUT/scan_tests.log" | head -40 | tee -a "$SUMMARY"
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  timeout 200 "$CS" --tool memcheck --error-exitcode 9 "$T" --gtest_filter='ScanRowMassCuda.*' >"$OUT/scan_memcheck.log" 2>&1
  log "memcheck exit $?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/scan_memcheck.log" | tail -3 | tee -a "$SUMMARY"
  SET=${SCAN_SET:-assets/models/report/needles.jsonl}
  if [ -f "$SET" ] && [ -x "$DS/bin/diffscope-scan" ]; then
    timeout 200 "$DS/bin/diffscope-scan" --model assets/models/diffllama-demo --compare-model assets/models/llama-demo \
      --input "$SET" --out "$OUT/scan_demo_cuda.json" --backend cuda --no-progress 2>&1 | tail -4 | tee -a "$SUMMARY"
  fi
  timeout 300 "$DS/bin/diffscope-bench" --backend cuda --only scan --json "$OUT/scan_bench.json" \
    2>&1 | tee "$OUT/scan_bench.log" | tail -12 | tee -a "$SUMMARY"
fi

if has sanitize; then
  log "## compute-sanitizer (reduced sizes: DS_CUDA_TEST_SMALL=1)"
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  export DS_CUDA_TEST_SMALL=1
  timeout 200 "$CS" --tool memcheck --error-exitcode 9 "$T" --gtest_filter="CudaKernels.*:Impl/FusedAttention.*:Fixtures/FixtureCuda.MatchesTransformers/diff_gqa_d64_llama3_bf16_tied:Fixtures/FixtureCuda.MatchesTransformers/llama_gqa_d32_f32" >"$OUT/sanitize.log" 2>&1
  log "memcheck exit $?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/sanitize.log" | tail -4 | tee -a "$SUMMARY"
  timeout 200 "$CS" --tool racecheck --error-exitcode 9 "$T" --gtest_filter='Impl/FusedAttention.*:CudaKernels.Maps*:CudaKernels.FusedMapView*:CudaKernels.Mamba*:CudaKernels.GemmSwiglu*:CudaKernels.GemmSiluMul*:CudaKernels.Generic*:CudaKernels.RmsNorm*' >>"$OUT/sanitize.log" 2>&1
  log "racecheck exit $?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" "$OUT/sanitize.log" | tail -4 | tee -a "$SUMMARY"
  DS_CUDA_INITCHECK_MARK_GEMM=1 timeout 200 "$CS" --tool initcheck --error-exitcode 9 "$T" --gtest_filter="CudaKernels.*:Impl/FusedAttention.*:Fixtures/FixtureCuda.MatchesTransformers/diff_gqa_d64_llama3_bf16_tied" >>"$OUT/sanitize.log" 2>&1
  log "initcheck (GEMM outputs pre-zeroed: cuBLAS's stores are invisible to it) exit $?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/sanitize.log" | tail -3 | tee -a "$SUMMARY"
  timeout 200 "$CS" --tool synccheck --error-exitcode 9 "$T" --gtest_filter='Impl/FusedAttention.*:CudaKernels.Maps*:CudaKernels.FusedMapView*:CudaKernels.Mamba*:CudaKernels.GemmSwiglu*:CudaKernels.GemmSiluMul*:CudaKernels.Generic*:CudaKernels.RmsNorm*' >>"$OUT/sanitize.log" 2>&1
  log "synccheck exit $?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/sanitize.log" | tail -3 | tee -a "$SUMMARY"
  unset DS_CUDA_TEST_SMALL
fi

# Chosen benchmark sections alone (BENCH_ONLY="model decode", BENCH_REPEAT): rows to bench_only.json.
if has bench_only; then
  log "## diffscope-bench --only ${BENCH_ONLY:-model}"
  timeout 400 "$DS/bin/diffscope-bench" --backend cuda --only ${BENCH_ONLY:-model} --repeat ${BENCH_REPEAT:-20} \
    --json "$OUT/bench_only.json" 2>&1 | tee -a "$SUMMARY" | tail -20
fi

# The one forward (engine/core/forward.h) on the device: memcheck and racecheck on the hook reader's kernel and on a
# prompt + decoding steps of every family through the CUDA ops (ForwardHooks.*), and a SambaY fixture.
if has sanitize_forward; then
  log "## compute-sanitizer on the forward's ops and the max|hidden| reader"
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  F='ForwardHooks.*:Fixtures/FixtureCuda.MatchesTransformers/phi4flash_L8_mha_f32:Fixtures/FixtureCuda.MatchesTransformers/motif_mha_d32_f32'
  DS_CUDA_TEST_SMALL=1 timeout 240 "$CS" --tool memcheck --error-exitcode 9 "$T" --gtest_filter="$F" >"$OUT/sanitize_forward.log" 2>&1
  log "memcheck exit $?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/sanitize_forward.log" | tail -4 | tee -a "$SUMMARY"
  DS_CUDA_TEST_SMALL=1 timeout 120 "$CS" --tool racecheck --error-exitcode 9 "$T" --gtest_filter='ForwardHooks.MaxAbsKernel' >>"$OUT/sanitize_forward.log" 2>&1
  log "racecheck exit $?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" "$OUT/sanitize_forward.log" | tail -3 | tee -a "$SUMMARY"
fi

# The previous commit's benchmark binary (PREV_BUILD at pack time) against this one, alternating (prev, this, prev,
# this) per section in one call: "speed unchanged" for a restructuring. AB_SECTIONS (default: the whole-model
# sections), AB_REPEAT (10). Every row's timings (keys ending in "ms") are compared best of the runs; rows go to
# forward_ab.json, the table to the summary.
if has forward_ab && [ -x "$DS/bin/diffscope-bench-prev" ]; then
  log "## previous commit ($(cat "$DS/bin/COMMIT_PREV" 2>/dev/null)) vs this one, alternating"
  for sec in ${AB_SECTIONS:-model table7 motif phi4flash decode views}; do
    if [ -n "${AB_DEADLINE:-}" ] && [ $SECONDS -gt $AB_DEADLINE ]; then log "$sec: skipped (AB_DEADLINE)"; continue; fi
    for i in 1 2; do
      for who in prev this; do
        b="$DS/bin/diffscope-bench"; [ $who = prev ] && b="$DS/bin/diffscope-bench-prev"
        timeout ${AB_TIMEOUT:-150} "$b" --backend cuda --only $sec --repeat ${AB_REPEAT:-10} --warmup-ms ${AB_WARMUP_MS:-500} \
          --json "$OUT/ab_${sec}_${who}_$i.json" >"$OUT/ab_${sec}_${who}_$i.log" 2>&1
        echo "$sec $who #$i exit $?" >> "$OUT/ab_exits.txt"
      done
    done
  done
  python3 tools/ab_compare.py "$OUT" | tee -a "$SUMMARY"
fi

if has views; then
  log "## views: long prompts through the map queries (kajuma shape, 1K .. 128K tokens)"
  timeout 400 "$DS/bin/diffscope-bench" --backend cuda --only views --json "$OUT/views.json" >"$OUT/views.log" 2>&1
  log "views exit $?"; tail -8 "$OUT/views.log" | tee -a "$SUMMARY"
fi
if has peers_views; then
  log "## transformers peers of the views (eager output_attentions, sdpa logits)"
  timeout 300 python3 bench/peers/peer_views.py "$OUT/peer_views.json" >"$OUT/peer_views.log" 2>&1
  log "peer_views exit $?"; tail -10 "$OUT/peer_views.log" | tee -a "$SUMMARY"
fi

if has soak; then
  log "## soak: 1000 runs of random prompts, lambda changes and maps on the demo model (CUDA)"
  "$DS/bin/diffscope-bench" --backend cuda --soak 1000 --tokens 400 --model "$ROOT/assets/models/diffllama-demo" \
    --json "$OUT/soak_cuda.json" 2>&1 | tail -3 | tee -a "$SUMMARY"
fi
# At most 8 files come back from a device call: keep the results, fold or drop the rest.
rm -f "$OUT/bench.log" "$OUT/sass.txt.gz"
log "done $(date -u +%FT%TZ)"
