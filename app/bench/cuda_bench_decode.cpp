// See cuda_bench_decode.h. Each row times launch_attn_decode (the split kernel and the combine kernel) at one context
// length n with q_rows = 1 and max_len = n, and again with max_len = 128K (the split count the engine's step, whose
// graph is captured for its largest length, runs with). The launches go into a CUDA graph, as the engine's step
// does, cycling over the slabs of a buffer of random bf16 rows; the slabs rotate so that the K/V bytes of the slabs
// together exceed three times the L2 cache and every launch reads its keys from device memory. A graph holds at
// least 32 launches (whole cycles of the slabs), so that the graph's own start, which the engine pays once per
// decoding step and not per layer, is spread thin (with one cycle of 3 slabs at 32K it added about 1.3 us to each
// launch). Time per launch: the graph's CUDA-event time over its launches, median over `repeat` graph launches
// after at least warmup_ms of them. Bytes: the K and V rows the launch must read, n x 2 x Hkv x d x 2. The copy
// bandwidth counts the bytes a cudaMemcpyAsync device-to-device of 1 GiB reads and writes (2 GiB per copy), median
// of 10.
#include "app/bench/cuda_bench_decode.h"
#include "app/bench/bench_median.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "engine/cuda/detail/backend_cuda_memory.h"
#include "kernels/attn_decode.h"
#include "kernels/fill.h"

namespace ds {
namespace {

using cuda::CudaEvent;
using cuda::DeviceBuffer;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using bf16 = __nv_bfloat16;
constexpr int kMinLaunches = 32;  // launches per graph, at least

struct GraphOwner {
  cudaGraph_t g = nullptr;
  cudaGraphExec_t e = nullptr;
  ~GraphOwner() {
    if (e) cudaGraphExecDestroy(e);
    if (g) cudaGraphDestroy(g);
  }
};

}  // namespace

double copy_bandwidth(cudaStream_t s) {
  const size_t bytes = size_t(1) << 30;
  DeviceBuffer a(bytes, "copy bandwidth probe"), b(bytes, "copy bandwidth probe");
  DS_CUDA_CHECK(kern::launch_fill_uniform_bf16(a.as<bf16>(), int64_t(bytes / 2), 5, 1.f, s));
  CudaEvent e0, e1;
  std::vector<double> ms;
  for (int i = 0; i < 13; ++i) {
    DS_CUDA_CHECK(cudaEventRecord(e0.get(), s));
    DS_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, s));
    DS_CUDA_CHECK(cudaEventRecord(e1.get(), s));
    DS_CUDA_CHECK(cudaEventSynchronize(e1.get()));
    float t = 0;
    DS_CUDA_CHECK(cudaEventElapsedTime(&t, e0.get(), e1.get()));
    if (i >= 3) ms.push_back(t);
  }
  return 2.0 * double(bytes) / (median(ms) * 1e-3);
}

json bench_decode_attn(int repeat, int warmup_ms) {
  int dev = 0, l2 = 0;
  DS_CUDA_CHECK(cudaGetDevice(&dev));
  DS_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  cudaDeviceProp prop{};
  DS_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  cudaStream_t raw = nullptr;
  DS_CUDA_CHECK(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking));
  const cuda::StreamPtr stream(raw);
  const cudaStream_t s = stream.get();
  const double bw = copy_bandwidth(s);

  // kajuma/DiffLlama-0.3B-handcut: 32 query heads, 8 kv heads, d = 64, differential (16 view heads).
  const int H = 32, Hkv = 8, d = 64, max_positions = 131072;
  const int64_t W = int64_t(H + 2 * Hkv) * d;
  const double row_kv_bytes = 2.0 * Hkv * d * 2;
  std::printf("\ndecode attention, kajuma shape (H %d, Hkv %d, d %d, differential), 1 query row; "
              "copy bandwidth %.0f GB/s (read + write)\n",
              H, Hkv, d, bw / 1e9);
  std::printf("%8s %8s %10s %12s %10s %8s %7s %6s %6s\n", "n", "max_len", "us", "K+V MB", "GB/s", "of copy", "splits",
              "ctas", "slabs");
  json rows = json::array();
  for (int n : {1024, 8192, 32768, 131072}) {
    const double kv_bytes = double(n) * row_kv_bytes;
    const int slabs = int(std::clamp(std::ceil(3.0 * double(l2) / kv_bytes), 2.0, 64.0));
    DeviceBuffer qkv(size_t(slabs) * size_t(n) * size_t(W) * 2, "decode benchmark inputs");
    DS_CUDA_CHECK(kern::launch_fill_uniform_bf16(qkv.as<bf16>(), int64_t(slabs) * n * W, 17 + uint64_t(n), 1.5f, s));
    DeviceBuffer out(size_t(H) * d * 2, "decode benchmark output"), len(4, "decode benchmark length");
    DS_CUDA_CHECK(cudaMemcpyAsync(len.get(), &n, 4, cudaMemcpyHostToDevice, s));
    DS_CUDA_CHECK(cudaStreamSynchronize(s));
    kern::AttnParams p;
    p.row_stride = W;
    p.batch_stride = int64_t(n) * W;
    p.q_off = 0;
    p.k_off = int64_t(H) * d;
    p.v_off = int64_t(H + Hkv) * d;
    p.n = n;
    p.heads = H;
    p.kv_heads = Hkv;
    p.d = d;
    p.diff = true;
    p.scale = float(1.0 / std::sqrt(double(d)));
    p.lambda = 0.6f;
    p.out_scale = 0.5f;
    p.eps = 1e-5f;
    p.out = out.as<bf16>();
    p.out_row_stride = int64_t(H) * d;
    p.qkv = qkv.as<bf16>();
    std::vector<int> max_lens = {n};
    if (n < max_positions) max_lens.push_back(max_positions);
    for (int max_len : max_lens) {
      kern::AttnDecodePlan plan;
      if (!kern::attn_decode_plan(p, 1, max_len, &plan)) throw std::runtime_error("decode_attn: shape not supported");
      DeviceBuffer ws(std::max<size_t>(kern::attn_decode_workspace(p, 1, max_len), 16), "decode benchmark workspace");
      GraphOwner graph;
      DS_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      cudaError_t le = cudaSuccess;
      const int launches = slabs * ((kMinLaunches + slabs - 1) / slabs);
      for (int i = 0; i < launches && le == cudaSuccess; ++i) {
        kern::AttnParams q = p;
        q.qkv = qkv.as<bf16>() + int64_t(i % slabs) * n * W;
        le = kern::launch_attn_decode(q, len.as<int32_t>(), 1, max_len, ws.get(), s);
      }
      DS_CUDA_CHECK(cudaStreamEndCapture(s, &graph.g));
      DS_CUDA_CHECK(le);
      DS_CUDA_CHECK(cudaGraphInstantiate(&graph.e, graph.g, 0));
      const auto t0 = Clock::now();
      for (int i = 0; i < 3 || Clock::now() - t0 < std::chrono::milliseconds(warmup_ms); ++i) {
        DS_CUDA_CHECK(cudaGraphLaunch(graph.e, s));
        DS_CUDA_CHECK(cudaStreamSynchronize(s));
      }
      CudaEvent e0, e1;
      std::vector<double> us;
      for (int r = 0; r < repeat; ++r) {
        DS_CUDA_CHECK(cudaEventRecord(e0.get(), s));
        DS_CUDA_CHECK(cudaGraphLaunch(graph.e, s));
        DS_CUDA_CHECK(cudaEventRecord(e1.get(), s));
        DS_CUDA_CHECK(cudaEventSynchronize(e1.get()));
        float ms = 0;
        DS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0.get(), e1.get()));
        us.push_back(1e3 * ms / launches);
      }
      const double t = median(us), gbs = kv_bytes / (t * 1e-6) / 1e9, frac = gbs * 1e9 / bw;
      std::printf("%8d %8d %10.2f %12.2f %10.0f %7.0f%% %7d %6d %6d\n", n, max_len, t, kv_bytes / 1e6, gbs, 100 * frac,
                  plan.splits, plan.ctas, slabs);
      rows.push_back({{"name", "diffscope_cuda_decode_attn[kajuma]"}, {"n", n}, {"max_len", max_len}, {"q_rows", 1},
                      {"us", t}, {"kv_bytes", kv_bytes}, {"gbs", gbs}, {"frac_of_copy", frac},
                      {"splits", plan.splits}, {"ctas", plan.ctas}, {"slabs", slabs}, {"launches", launches}});
    }
  }
  return {{"device", prop.name},
          {"shape", {{"heads", H}, {"kv_heads", Hkv}, {"head_dim", d}, {"diff", true}, {"row_stride", W}}},
          {"copy_gbs", bw / 1e9},
          {"copy_note", "cudaMemcpyAsync device to device of 1 GiB, bytes read + written per second, median of 10"},
          {"bytes_note", "K and V rows the launch reads: n x 2 x Hkv x d x 2 bytes"},
          {"repeat", repeat},
          {"rows", rows}};
}

}  // namespace ds
