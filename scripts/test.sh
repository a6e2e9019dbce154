#!/usr/bin/env bash
# Every test, as CI runs it: the main build (with the CUDA backend when nvcc is on the machine, and the GUI),
# the same suite rebuilt under AddressSanitizer + UndefinedBehaviorSanitizer, then bounded fuzzing of the parsers.
# CUDA tests skip with a message when no GPU is present; everything else must pass.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

echo "== main build"
cmake -S . -B build -G Ninja -DDS_ENABLE_CUDA=ON  # everything: CUDA too when nvcc is here
cmake --build build
ctest --test-dir build --output-on-failure -j"$jobs"

echo "== AddressSanitizer + UndefinedBehaviorSanitizer (CPU engine, CLI, tokenizers)"
cmake -S . -B build-asan -G Ninja -DDS_SANITIZE=ON -DDS_ENABLE_CUDA=OFF -DDS_BUILD_GUI=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-asan
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs"

echo "== fuzzing (bounded)"
scripts/fuzz.sh "${DS_FUZZ_SECONDS:-30}"
