#!/usr/bin/env bash
# Builds the Python module's native part for another CPython than the build's own -- the GPU machine's Python 3.12,
# whose packages (torch, CuPy) the device tests use -- from the main build's engine libraries, without a second
# engine build:
#   tools/build_py_module_for.sh INCLUDE_DIR EXT_SUFFIX OUT_DIR [BUILD_DIR]
# INCLUDE_DIR holds that Python's Python.h (copied from the machine; on Debian and Ubuntu with the multiarch
# pyconfig.h under INCLUDE_DIR/../x86_64-linux-gnu/python3.X), EXT_SUFFIX is its
# sysconfig EXT_SUFFIX (".cpython-312-x86_64-linux-gnu.so"). The flags follow nanobind_add_module(NB_STATIC).
set -euo pipefail
cd "$(dirname "$0")/.."
INC=$1 SUFFIX=$2 OUT=$3 B=${4:-build}
[ -f "$INC/Python.h" ] || { echo "build_py_module_for: no Python.h in $INC" >&2; exit 2; }
[ -f "$B/libdiffscope_cuda.a" ] || { echo "build_py_module_for: $B has no CUDA engine libraries" >&2; exit 2; }
NB=$(.venv/bin/python3 -m nanobind --include_dir)/..
CUDA=/usr/local/cuda
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
flags=(-O2 -fPIC -fvisibility=hidden -ffunction-sections -fdata-sections -I"$INC" -I"$INC/.." -I"$NB/include")
g++ "${flags[@]}" -std=c++17 -DNB_BUILD -DNB_BACKEND_NAME=_diffscope -I"$NB/ext/robin_map/include" \
  -c "$NB/src/nb_combined.cpp" -o "$TMP/nb.o"
g++ "${flags[@]}" -std=c++20 -DDS_HAVE_CUDA=1 -DDS_HAVE_CUPTI=1 -I. -isystem "$CUDA/include" \
  -c python/src/module.cpp -o "$TMP/module.o"
mkdir -p "$OUT"
g++ -shared -Wl,-s -Wl,--gc-sections -o "$OUT/_diffscope$SUFFIX" "$TMP/module.o" "$TMP/nb.o" \
  "$B/libdiffscope_engine.a" "$B/libdiffscope_cpu.a" "$B/libdiffscope_cuda.a" "$B/libdiffscope_core.a" \
  -lopenblas -lpcre2-8 -lsentencepiece -L"$CUDA/lib64" -lcudart -lcublas -lcublasLt -lcupti -lpthread -ldl
cp python/diffscope/*.py python/diffscope/*.pyi python/diffscope/py.typed "$OUT/"
echo "wrote $OUT/_diffscope$SUFFIX"
