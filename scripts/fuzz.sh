#!/usr/bin/env bash
# Build the libFuzzer targets with clang (ASan + UBSan) and run each for a bounded time on its committed seed
# corpus. Any crash, hang (-timeout), leak or sanitizer report fails the run. Usage: scripts/fuzz.sh [SECONDS]
# CI runs a fixed seed and a fixed number of inputs per target (about SECONDS each), so a CI run repeats what a
# developer's run with the same seed saw; DS_FUZZ_SEED=0 picks a random seed for exploratory runs.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}
cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DDS_ENABLE_CUDA=OFF -DDS_BUILD_GUI=OFF -DDS_BUILD_TESTS=OFF -DDS_FUZZ=ON >/dev/null
cmake --build build-fuzz
seed=${DS_FUZZ_SEED:-1}
# inputs per second and target, measured on a 2-core CI-like machine under ASan + UBSan
declare -A rate=([safetensors]=7000 [shard_index]=2000 [config]=8000 [tokenizer_load]=1000 [tokenizer_encode]=3000 [cli_args]=15000
                [corpus]=2000 [settings]=8000 [prompt_files]=3000)
for t in safetensors shard_index config tokenizer_load tokenizer_encode cli_args corpus settings prompt_files; do
  runs=$(( ${rate[$t]} * secs ))
  work=$(mktemp -d)
  cp -r tests/fuzz/corpus/$t/. "$work/"
  echo "fuzz: $t, $runs inputs, seed $seed"
  # Findings are written to build-fuzz/findings-$t-*; the corpus copy is thrown away.
  rc=0
  (cd build-fuzz && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ./tests/fuzz/fuzz_$t -seed="$seed" -runs="$runs" -max_total_time=$((secs * 4)) -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
     -artifact_prefix="findings-$t-" "$work" >"fuzz-$t.log" 2>&1) || rc=$?
  grep -E "^(stat::number_of_executed_units|stat::new_units_added|SUMMARY)" "build-fuzz/fuzz-$t.log" || true
  if [ $rc -ne 0 ]; then
    tail -40 "build-fuzz/fuzz-$t.log"
    echo "fuzz: $t FAILED (exit $rc; input saved as build-fuzz/findings-$t-*)"
    exit 1
  fi
  rm -rf "$work"
done
echo "fuzz: all targets ran clean"
