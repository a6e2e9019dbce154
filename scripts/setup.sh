#!/usr/bin/env bash
# Installs what diffscope needs to build, run and test on Debian 12 (run as root), then makes a Python virtual
# environment (.venv) with the packages the tests compare against and the Python module's build needs. Installs only what is missing; safe to re-run.
# CUDA is not installed here: when the CUDA Toolkit is on the machine (nvcc in /usr/local/cuda), the build uses it.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(
  build-essential cmake ninja-build pkg-config
  libopenblas-dev libpcre2-dev libsentencepiece-dev nlohmann-json3-dev
  libimgui-dev libglfw3-dev libstb-dev libgl-dev fonts-dejavu-core libcairo2-dev
  libgtest-dev libgmock-dev clang libclang-rt-14-dev
  xvfb xauth libgl1-mesa-dri
  python3 python3-venv python3-pip python3-dev
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
# The Python module diffscope: the main build (cmake --build build) makes it in build/python; this path file puts it
# on the venv's path, so .venv/bin/python imports the build's module without a second build of the engine. (pip
# install . builds and installs a copy of its own instead: README, "Python".)
site=$(.venv/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$PWD/build/python" >"$site/diffscope-build.pth"
echo "setup: done"
