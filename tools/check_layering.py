#!/usr/bin/env python3
"""Checks that the engine's libraries depend in one direction only: core <- cpu, cuda <- engine (the session layer).

Three checks, against the rule CMakeLists.txt states (a library is a folder: engine/core, engine/cpu, engine/cuda with
kernels/, engine/session; a header in a library's detail/ folder is private to it):
  includes  no engine/ or kernels/ file includes a header of a layer above its own
  private   no program (app/, but the kernel benchmarks app/bench/cuda_* and cpu_bench_attention, which time the
            kernels themselves) includes a private header (engine/*/detail/, a kernels/ header that needs CUDA)
  symbols   (given the built static libraries) no library needs a symbol that only a library above it defines
A header in kernels/ that needs no CUDA (no CUDA header, directly or through the headers it includes) counts as
core: it holds conventions both backends share and compiles on the host too (kernels/attn_heads.h).

usage: check_layering.py --source DIR [--lib core=PATH --lib cpu=PATH [--lib cuda=PATH] --lib engine=PATH]
Exit status 0 when every arrow points down, 1 with one line per violation otherwise."""
import argparse, os, re, subprocess, sys

LEVEL = {"core": 0, "cpu": 1, "cuda": 1, "engine": 2}


INCLUDE_RE = re.compile(r'^\s*#\s*include\s+([<"])([^">]+)[">]', re.M)
CUDA_HEADER_RE = re.compile(r"^(cuda|cublas|cupti|nv|mma|cute|cutlass)|\.cuh$")
SOURCE = "."


def includes(rel):
    """(kind, name) of each #include of a file: kind '<' or '"'."""
    path = os.path.join(SOURCE, rel)
    if not os.path.exists(path):
        return []
    return INCLUDE_RE.findall(open(path, encoding="utf-8", errors="replace").read())


def resolve(rel, inc):
    """The repo path a quoted include names (relative to the repo root or to the including file's folder)."""
    return inc if "/" in inc else f"{os.path.dirname(rel)}/{inc}"


def needs_cuda(rel, seen=None):
    """Whether a header reaches a CUDA header, directly or through the repo headers it includes."""
    seen = set() if seen is None else seen
    if rel in seen:
        return False
    seen.add(rel)
    for kind, inc in includes(rel):
        if CUDA_HEADER_RE.search(os.path.basename(inc)):
            return True
        if kind == '"' and needs_cuda(resolve(rel, inc), seen):
            return True
    return False


def layer_of(rel):
    """The layer of a file by its folder; None for files outside the engine and kernels."""
    parts = rel.split("/")
    if parts[0] == "kernels":
        return "core" if rel.endswith(".h") and not needs_cuda(rel) else "cuda"
    if parts[0] != "engine" or len(parts) < 3:
        return None
    return {"core": "core", "cpu": "cpu", "cuda": "cuda", "session": "engine"}.get(parts[1])


def engine_files(src):
    for d in ("engine/core", "engine/cpu", "engine/cuda", "engine/session", "kernels"):
        for sub in ("", "/detail"):
            folder = os.path.join(src, d + sub)
            if os.path.isdir(folder):
                for name in sorted(os.listdir(folder)):
                    if re.search(r"\.(h|cpp|cu|cuh|inc)$", name):
                        yield f"{d}{sub}/{name}"


def check_private(src):
    bad = []
    for root, _, names in os.walk(os.path.join(src, "app")):
        for name in sorted(names):
            rel = os.path.relpath(os.path.join(root, name), src)
            if not re.search(r"\.(h|cpp)$", name) or re.match(r"app/bench/(cuda_|cpu_bench_attention)", rel):
                continue
            for kind, inc in includes(rel):
                cuda_kernel = inc.startswith("kernels/") and layer_of(inc) == "cuda"
                if kind == '"' and (re.match(r"engine/[^/]+/detail/", inc) or cuda_kernel):
                    bad.append(f"{rel} (a program) includes the private header {inc}")
    return bad


def check_includes(src):
    bad = []
    for rel in engine_files(src):
        mine = layer_of(rel)
        for kind, inc in includes(rel):
            if kind != '"':
                continue
            target = resolve(rel, inc)
            theirs = layer_of(target)
            if theirs is None or not os.path.exists(os.path.join(src, target)):
                continue
            # Sideways (cpu <-> cuda) is as wrong as upwards: neither backend may know the other.
            if LEVEL[theirs] > LEVEL[mine] or (LEVEL[theirs] == LEVEL[mine] and theirs != mine):
                bad.append(f"{rel} ({mine}) includes {target} ({theirs})")
    return bad


def symbols(path):
    """(strongly defined, undefined) external symbols of a static library, mangled."""
    out = subprocess.run(["nm", "-g", "--format=posix", path], check=True, capture_output=True, text=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        f = line.split()
        if len(f) < 2 or f[0].endswith(":"):
            continue
        if f[1] == "U":
            undefined.add(f[0])
        elif f[1] in "TDBRGS":  # weak (W, V) and unique (u) symbols are inline code every user may carry
            defined.add(f[0])
    return defined, undefined


def check_symbols(libs):
    table = {name: symbols(path) for name, path in libs.items()}
    bad = []
    for name, (_, undefined) in table.items():
        allowed = set()
        for other, (defined, _) in table.items():
            if LEVEL[other] < LEVEL[name] or other == name:
                allowed |= defined
        for other, (defined, _) in table.items():
            if other == name or LEVEL[other] < LEVEL[name]:
                continue
            for sym in sorted((undefined & defined) - allowed):
                bad.append(f"library {name} needs {sym} from {other}")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True)
    ap.add_argument("--lib", action="append", default=[], metavar="LAYER=PATH")
    a = ap.parse_args()
    global SOURCE
    SOURCE = a.source
    libs = dict(x.split("=", 1) for x in a.lib)
    unknown = set(libs) - set(LEVEL)
    if unknown:
        ap.error(f"unknown layer(s) {sorted(unknown)}: use {sorted(LEVEL)}")
    bad = check_includes(a.source) + check_private(a.source) + (check_symbols(libs) if libs else [])
    for b in bad:
        print("layering:", b)
    verdict = f"FAILED, {len(bad)} arrow(s) point up or sideways" if bad else "every arrow points down"
    print(f"layering: {verdict} ({len(libs)} libraries checked)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
