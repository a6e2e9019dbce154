#!/usr/bin/env bash
# Installs what diffscope needs to build, run and test on Debian 12 (run as root), then makes a Python virtual
# environment (.venv) with the packages the tests compare against. Installs only what is missing; safe to re-run.
# CUDA is not installed here: when the CUDA Toolkit is on the machine (nvcc in /usr/local/cuda), the build uses it.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(
  build-essential cmake ninja-build pkg-config
  libopenblas-dev libpcre2-dev libsentencepiece-dev nlohmann-json3-dev
  libimgui-dev libglfw3-dev libstb-dev libgl-dev fonts-dejavu-core libcairo2-dev
  libgtest-dev libgmock-dev clang libclang-rt-14-dev
  xvfb xauth libgl1-mesa-dri
  python3 python3-venv python3-pip
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Python packages for the tests (reference tokenizers); a venv keeps them off the system Python.
if [ ! -x .venv/bin/python3 ]; then
  python3 -m venv .venv
fi
.venv/bin/python3 -m pip install --quiet --disable-pip-version-check -r scripts/requirements-test.txt
echo "setup: done"
