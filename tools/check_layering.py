#!/usr/bin/env python3
"""Checks that the engine's libraries depend in one direction only: core <- cpu, cuda <- engine (the session layer).

Two checks, both against the rule CMakeLists.txt states for which file goes to which layer:
  includes  no engine/ or kernels/ file includes a header of a layer above its own
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
    """The layer of a file, by the naming rule of CMakeLists.txt; None for files outside the engine and kernels."""
    d, name = os.path.split(rel)
    if d == "kernels":
        return "core" if name.endswith(".h") and not needs_cuda(rel) else "cuda"
    if d != "engine":
        return None
    stem = name.split(".")[0]
    if stem.startswith("backend_cpu"):
        return "cpu"
    if stem.startswith("backend_cuda"):
        return "cuda"
    if stem.startswith("session") or stem.startswith("backends") or stem.endswith("_unavailable"):
        return "engine"
    return "core"


def check_includes(src):
    bad = []
    for d in ("engine", "kernels"):
        for name in sorted(os.listdir(os.path.join(src, d))):
            rel = f"{d}/{name}"
            if not re.search(r"\.(h|cpp|cu|cuh)$", name):
                continue
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
    bad = check_includes(a.source) + (check_symbols(libs) if libs else [])
    for b in bad:
        print("layering:", b)
    verdict = f"FAILED, {len(bad)} arrow(s) point up or sideways" if bad else "every arrow points down"
    print(f"layering: {verdict} ({len(libs)} libraries checked)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
