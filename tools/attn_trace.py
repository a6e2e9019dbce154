#!/usr/bin/env python3
"""Reads the per-CTA timestamps of the v9 Hopper attention kernel and says where each CTA's time goes.

Make the dump with a diagnostic build (-DCMAKE_CUDA_FLAGS=-DDS_ATTN_TRACE) on the GPU machine:
    DS_ATTN_TRACE_OUT=trace.txt diffscope-bench --backend cuda --only attention
then:  tools/attn_trace.py trace.txt[.gz] [--all-d]

Each block of the dump is one launch (the 400th of its shape): a header line, then one line per CTA with the SM id,
the number of key tiles, and SM-clock timestamps (entry, Q landed, diagonal tile done, map 1 / map 2 loop done,
tile stored). Printed per shape: a least-squares fit of CTA time = a * key tiles + b, the median of each phase, the
median gap between consecutive CTAs on one SM, and the per-SM span over what the key tiles alone would take at
rate a (1.0 = no time outside the key-tile loop).
"""
import gzip
import sys

import numpy as np


def blocks(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        text = f.read()
    for blk in text.split("# ")[1:]:
        lines = blk.strip().split("\n")
        rows = np.array([[int(x) for x in line.split()] for line in lines[1:]], dtype=np.int64)
        yield lines[0], rows


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    all_d = "--all-d" in sys.argv
    for header, a in blocks(sys.argv[1]):
        if not all_d and " d 128" not in header:
            continue
        sm, nkt, t0, tq, tdiag, t1, t2, tend = a.T
        fit = np.linalg.lstsq(np.vstack([nkt, np.ones_like(nkt)]).T, tend - t0, rcond=None)[0]
        gaps, spans = [], []
        for s in np.unique(sm):
            o = np.where(sm == s)[0]
            o = o[np.argsort(t0[o])]
            gaps += list(t0[o][1:] - tend[o][:-1])
            spans.append(tend[o].max() - t0[o].min())
        ideal = nkt.sum() / len(np.unique(sm)) * fit[0]
        print(f"## {header}")
        print(f"  CTA time = {fit[0]:.0f} cycles per key tile * n_kt + {fit[1]:.0f}")
        print(f"  medians: entry -> Q landed {np.median(tq - t0):.0f}, Q -> diagonal tile done {np.median(tdiag - tq):.0f}, "
              f"map 1 -> map 2 loop end {np.median(t2 - t1):.0f}, last loop end -> stored {np.median(tend - np.maximum(t1, t2)):.0f}, "
              f"gap between CTAs on an SM {np.median(gaps):.0f}")
        print(f"  per-SM span median {np.median(spans):.0f} cycles = {np.median(spans) / ideal:.3f} x the key tiles alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
