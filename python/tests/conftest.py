"""Shared fixtures of the Python module's tests: paths, the CLI, and a small safetensors reader (the format is a
JSON header and raw little-endian arrays; reading it here keeps the tests free of the safetensors package)."""
import json
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import diffscope

ROOT = Path(os.environ.get("DS_SOURCE_DIR", Path(__file__).resolve().parents[2]))
BUILD = Path(os.environ.get("DS_BINARY_DIR", ROOT / "build"))
DEMO = ROOT / "assets" / "models" / "diffllama-demo"
TWIN = ROOT / "assets" / "models" / "llama-demo"
FIXTURES = ROOT / "tests" / "fixtures"

_DTYPES = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64, "BF16": None}


def read_safetensors(path) -> dict:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype=_DTYPES[t["dtype"]]).reshape(t["shape"])
    return out


def cli(*args, check=True) -> subprocess.CompletedProcess:
    exe = BUILD / "diffscope-run"
    if not exe.exists():
        pytest.skip(f"{exe} is not built")
    p = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True)
    # The device pack's stand-in for OpenBLAS (tools/cblas_standin.c) says so once on stderr; it is not the program's.
    p.stderr = "".join(l for l in p.stderr.splitlines(True) if not l.startswith("diffscope pack: "))
    if check and p.returncode != 0:
        raise AssertionError(f"diffscope-run {' '.join(map(str, args))}: exit {p.returncode}: {p.stderr}")
    return p


def fixture_dirs(pred=lambda cfg: True):
    out = []
    for d in sorted(FIXTURES.iterdir()):
        if (d / "expected.safetensors").exists():
            cfg = json.loads((d / "config.json").read_text())
            if pred(cfg):
                out.append(d)
    return out


@pytest.fixture(scope="module")
def demo():
    s = diffscope.open(DEMO, backend="cpu", threads=2)
    yield s
    s.close()


def cuda_or_skip():
    if not diffscope.cuda_built():
        pytest.skip("this build of the module has no CUDA backend (no nvcc when it was configured)")
    if not diffscope.cuda_available():
        pytest.skip("no usable NVIDIA GPU on this machine")
