#!/usr/bin/env python3
"""The hidden states' outlier statistics (Session.outliers(logits=False)) with the selection on the device against
the host's selection between the device's passes (DS_OUTLIER_DEVICE_SELECT=0), in one process, sessions alternating
1 / 0 / 1, against the forward at 4K and 32K tokens (medians of 15 calls; the forward's of 7).

  PYTHONPATH=build/python python3 bench/outlier_select_ab.py MODEL_DIR
"""
import os
import statistics
import sys
import time

import numpy as np


def med(f, k=15):
    ts = []
    for _ in range(k):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def main():
    for sel in ("1", "0", "1"):
        os.environ["DS_OUTLIER_DEVICE_SELECT"] = sel  # read when the CUDA backend starts
        import diffscope
        with diffscope.open(sys.argv[1], backend="cuda") as s:
            rng = np.random.default_rng(7)
            for n in (4096, 32768):
                s.run(rng.integers(0, 128000, size=n).tolist())
                s.outliers(logits=False)
                flip = [1.0]

                def forward():  # every layer again (a lambda scale change), next-token logits
                    flip[0] = 1.0 if flip[0] != 1.0 else 1.001
                    s.lambda_scale = flip[0]
                    s.run()
                f = med(forward, 7)
                s.outliers(logits=False)  # every row once (the forward above kept the last one)
                o = med(lambda: s.outliers(logits=False))
                print(f"select_on_device={sel} n={n} forward {f:.2f} ms outliers(hidden) {o:.3f} ms = "
                      f"{100 * o / f:.2f} %", flush=True)


if __name__ == "__main__":
    main()
