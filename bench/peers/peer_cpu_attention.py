"""CPU peer of diffscope-bench's attention section (--backend cpu --only attention): causal differential attention of
one layer's view heads with PyTorch's CPU scaled_dot_product_attention, f32, batch 1, the same shapes and token counts.
diffscope-bench runs it when given --peer-python PATH; by hand:
  .venv-peer/bin/python bench/peers/peer_cpu_attention.py --threads 2 --repeat 5 --tokens 1024,3072,8192 \
      --shape demo:4:32 --shape kajuma:16:64
Two recipes of the Differential Transformer paper (Ye et al. 2024, arXiv 2410.05258, appendix: FlashDiffAttn_1/_2),
q1, k1, q2, k2 [1, Hv, n, d] and v [1, Hv, n, 2d]:
  fd1  out = SDPA(q1, k1, v) - lambda SDPA(q2, k2, v): two calls with a 2d-wide V
  fd2  V split into halves of width d, four calls, the halves concatenated: what a kernel that needs
       value width == head dim can run
The faster of the two is "the peer". Which SDPA backend torch picks for each (torch._fused_sdp_choice) is recorded:
its CPU flash kernel wants value width == head dim, so fd1 falls to the math path, which materialises n x n scores
(torch 2.15: fd1 MATH, fd2 FLASH_ATTENTION); fd1 is skipped where that would not fit in memory.
Timing: a warm-up (at least one call and --warmup-ms of calls), then the median of --repeat calls, each call's wall
time (perf_counter). Peak RSS per shape (VmHWM, reset through /proc/self/clear_refs before the shape) as our side
reports it. Also torch's f32 matmul rate at 2048^3 (best of 3). JSON on stdout; progress on stderr."""
import argparse, json, os, sys, time
import torch
import torch.nn.functional as F


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: all cores)")
    p.add_argument("--repeat", type=int, default=5, help="timed calls; the median is reported")
    p.add_argument("--warmup-ms", type=float, default=300, help="warm-up: at least one call and this many ms of calls")
    p.add_argument("--tokens", default="1024,3072,8192", help="comma-separated token counts")
    p.add_argument("--shape", action="append", default=[], help="NAME:VIEW_HEADS:HEAD_DIM (repeatable)")
    p.add_argument("--lambda", dest="lam", type=float, default=0.5, help="lambda of the second map")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args()


def status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return -1


def reset_peak_rss():
    try:  # "5" resets VmHWM to the current RSS (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 1 << 62


def median_ms(fn, repeat, threads=1, warmup_ms=0):
    """(median ms, sorted run times, cpu share): the share of the threads' cores the process had while timed, as
    diffscope-bench reports it (well below 1: the cores were shared with something else)."""
    t0 = time.perf_counter()
    fn()  # warm-up: at least one call (allocations, the thread pool), and warmup_ms of calls (clocks)
    while (time.perf_counter() - t0) * 1e3 < warmup_ms:
        fn()
    ts = []
    cpu0 = time.process_time()
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e3)
    share = (time.process_time() - cpu0) * 1e3 / (sum(ts) * threads)
    ts.sort()
    return ts[len(ts) // 2], ts, share  # the upper middle, as app/bench/bench_median.h


def flops(hv, d, n):  # kernels/attn_heads.h attn_flops(diff=true): 12 n^2 d per differential head, halved (causal)
    return 12.0 * n * n / 2.0 * d * hv


def backend_name(q, k, v):
    try:
        from torch.nn.attention import SDPBackend
        return SDPBackend(torch._fused_sdp_choice(q, k, v, is_causal=True)).name
    except Exception as e:  # a private API: record why instead of failing the run
        return "unknown (%s)" % type(e).__name__


def main():
    a = parse()
    threads = a.threads if a.threads > 0 else (os.cpu_count() or 1)
    torch.set_num_threads(threads)
    tokens = [int(t) for t in a.tokens.split(",") if t]
    shapes = []
    for s in a.shape or ["demo:4:32", "kajuma:16:64"]:
        name, hv, d = s.split(":")
        shapes.append((name, int(hv), int(d)))
    res = {"torch": torch.__version__, "threads": torch.get_num_threads(), "repeat": a.repeat, "warmup_ms": a.warmup_ms,
           "cpu_capability": torch.backends.cpu.get_cpu_capability(), "lambda": a.lam, "shapes": []}
    # torch's own f32 matmul rate (MKL, or oneDNN, at torch's CPU capability), for reading the SDPA numbers beside
    # diffscope's OpenBLAS sgemm yardstick: the two BLAS libraries need not use the same vector width.
    x, y = torch.randn(2048, 2048), torch.randn(2048, 2048)
    best = min(median_ms(lambda: x @ y, 3)[1])
    res["matmul_gflops"] = 2 * 2048**3 / best / 1e6
    del x, y
    s = F.scaled_dot_product_attention
    lam = a.lam
    for name, hv, d in shapes:
        rows = []
        reset = reset_peak_rss()
        rss0 = status_kb("VmRSS:")
        for n in tokens:
            g = torch.Generator().manual_seed(a.seed + n)
            q1, k1, q2, k2 = [torch.randn(1, hv, n, d, generator=g) for _ in range(4)]
            v = torch.randn(1, hv, n, 2 * d, generator=g)
            v1, v2 = v[..., :d].contiguous(), v[..., d:].contiguous()

            def fd1():
                return s(q1, k1, v, is_causal=True) - lam * s(q2, k2, v, is_causal=True)

            def fd2():
                a1 = torch.cat([s(q1, k1, v1, is_causal=True), s(q1, k1, v2, is_causal=True)], -1)
                a2 = torch.cat([s(q2, k2, v1, is_causal=True), s(q2, k2, v2, is_causal=True)], -1)
                return a1 - lam * a2

            row = {"tokens": n, "flops": flops(hv, d, n)}
            with torch.inference_mode():
                for key, fn, vv in (("fd1", fd1, v), ("fd2", fd2, v1)):
                    sdpa = backend_name(q1, k1, vv)
                    # The math path holds [Hv, n, n] f32 scores and their softmax (and a temporary) at once: where
                    # that would not fit comfortably, skip the recipe rather than be killed and lose every row.
                    need = 3 * 4 * hv * n * n
                    if sdpa == "MATH" and need > mem_available() // 2:
                        row[key] = {"skipped": "SDPA math path would need ~%.1f GB, over half of MemAvailable"
                                               % (need / 1e9), "sdpa_backend": sdpa}
                        print("peer %s n=%d %s: skipped" % (name, n, key), file=sys.stderr, flush=True)
                        continue
                    try:
                        ms, ts, share = median_ms(fn, a.repeat, threads, a.warmup_ms)
                        row[key] = {"ms": ms, "runs_ms": ts, "tflops": row["flops"] / ms / 1e9, "cpu_share": share,
                                    "sdpa_backend": sdpa}
                    except Exception as e:  # e.g. out of memory in the math path: keep the other recipe
                        row[key] = {"error": "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:200]),
                                    "sdpa_backend": sdpa}
                    print("peer %s n=%d %s: %s" % (name, n, key, json.dumps(row[key].get("ms", row[key]))),
                          file=sys.stderr, flush=True)
            done = [k for k in ("fd1", "fd2") if "ms" in row[k]]
            if done:
                best = min(done, key=lambda k: row[k]["ms"])
                row["best"] = best
                row["ms"] = row[best]["ms"]
                row["tflops"] = row[best]["tflops"]
            rows.append(row)
            del q1, k1, q2, k2, v, v1, v2
        res["shapes"].append({"name": name, "view_heads": hv, "head_dim": d, "rows": rows,
                              "peak_rss_kb": status_kb("VmHWM:"), "rss_kb_at_start": rss0, "peak_rss_reset": reset})
    json.dump(res, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
