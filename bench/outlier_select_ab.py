#!/usr/bin/env python3
"""The hidden states' outlier statistics (Session.outliers(logits=False)) with and without one of the selection's
switches, in one process, sessions alternating 1 / 0 / 1, against the forward at 4K and 32K tokens (medians of 15
calls after a warm-up; the forward's of 7). The switches (read when the CUDA backend starts):
  DS_OUTLIER_DEVICE_SELECT  0: the host's selection between the device's passes (the default switch)
  DS_OUTLIER_COMPACT        0: every pass of the device's selection over the whole hidden states

  PYTHONPATH=build/python python3 bench/outlier_select_ab.py MODEL_DIR [SWITCH]
"""
import os
import sys

import numpy as np

from residual_bench import timed  # (a warm-up call, then the median of `repeat` calls, ms)


def main():
    switch = sys.argv[2] if len(sys.argv) > 2 else "DS_OUTLIER_DEVICE_SELECT"
    for sel in ("1", "0", "1"):
        os.environ[switch] = sel  # read when the CUDA backend starts
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
                f = timed(forward, 7)
                s.outliers(logits=False)  # every row once (the forward above kept the last one)
                o = timed(lambda: s.outliers(logits=False), 15)
                print(f"{switch}={sel} n={n} forward {f:.2f} ms outliers(hidden) {o:.3f} ms = "
                      f"{100 * o / f:.2f} %", flush=True)


if __name__ == "__main__":
    main()
