#!/usr/bin/env bash
# Makes .venv-peer, the Python environment of the CPU attention peer (bench/peers/peer_cpu_attention.py, run by
# `diffscope-bench --backend cpu --only attention --peer-python .venv-peer/bin/python`) and of the Python module's
# benchmark's peer (bench/python_api_bench.py: transformers' DiffLlama with output_attentions): torch, transformers
# and numpy from PyPI.
# Kept apart from .venv (scripts/setup.sh, the tests' packages) on purpose: torch is large and only this benchmark
# needs it, so the test setup never installs it. Safe to re-run. Note: PyPI's Linux torch wheel is the CUDA build; its
# CPU kernels are the same as the CPU-only wheel's, only the download is bigger.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -m venv .venv-peer
.venv-peer/bin/pip install --upgrade pip
.venv-peer/bin/pip install torch numpy transformers==5.24.0
.venv-peer/bin/python -c "import torch; print('torch', torch.__version__, 'cpu capability', torch.backends.cpu.get_cpu_capability())"
