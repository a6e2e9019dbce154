// The selective scan keeps one (channel, state) pair of h per lane: a group of G lanes (G = 16, or 32 when
// d_state > 16) holds one channel, and each step reduces C h over the group with shuffles. Time is sequential inside
// a lane; channels (d_inner = 5120 in Phi-4-mini-flash: 640 blocks of 8 channels) give the parallelism. The next
// step's inputs are loaded before the current step's arithmetic, so a step waits on the shuffles and the exp, not
// on memory. The convolution is element-wise over (token, channel), K taps read from the previous rows.
#include "mamba_scan.h"

namespace ds::kern {
namespace {

constexpr int THREADS = 128;

__device__ __forceinline__ float silu(float x) { return x / (1.f + __expf(-x)); }
__device__ __forceinline__ float softplus(float x) { return x <= 20.f ? log1pf(__expf(x)) : x; }

__global__ void __launch_bounds__(256) conv_silu_kernel(const __nv_bfloat16* x, int64_t ld_x, const float* w,
                                                        const float* bias, int K, __nv_bfloat16* u, int64_t ld_u,
                                                        int64_t n, int channels) {
  const int64_t i = int64_t(blockIdx.x) * 256 + threadIdx.x;
  if (i >= n * channels) return;
  const int64_t t = i / channels;
  const int c = int(i % channels);
  float acc = bias ? bias[c] : 0.f;
  for (int k = 0; k < K; ++k) {
    const int64_t s = t - (K - 1) + k;
    if (s >= 0) acc = fmaf(w[int64_t(c) * K + k], __bfloat162float(x[s * ld_x + c]), acc);
  }
  u[t * ld_u + c] = __float2bfloat16(silu(acc));
}

template <int G>
__global__ void __launch_bounds__(THREADS) scan_kernel(const ScanParams p) {
  const int lane = threadIdx.x % G, c = int(blockIdx.x) * (THREADS / G) + int(threadIdx.x) / G;
  const bool live = c < p.channels, on = live && lane < p.state;
  const float a = on ? p.A[int64_t(c) * p.state + lane] : 0.f;
  const float bias = live ? p.dt_bias[c] : 0.f, dskip = live ? p.D[c] : 0.f;
  float h = 0.f;
  // inputs of step t, loaded one step ahead
  auto load = [&](int64_t t, float& u, float& dt, float& b, float& cc, float& zz) {
    u = live ? __bfloat162float(p.u[t * p.ld_u + c]) : 0.f;
    dt = live ? __bfloat162float(p.dt[t * p.ld_dt + c]) : 0.f;
    b = on ? __bfloat162float(p.B[t * p.ld_bc + lane]) : 0.f;
    cc = on ? __bfloat162float(p.C[t * p.ld_bc + lane]) : 0.f;
    zz = live && p.y_gated ? __bfloat162float(p.z[t * p.ld_z + c]) : 0.f;
  };
  float u, dt, b, cc, zz;
  load(0, u, dt, b, cc, zz);
  for (int64_t t = 0; t < p.n; ++t) {
    const float u0 = u, dt0 = dt, b0 = b, c0 = cc, z0 = zz;
    if (t + 1 < p.n) load(t + 1, u, dt, b, cc, zz);
    const float delta = softplus(dt0 + bias);
    h = fmaf(__expf(delta * a), h, delta * b0 * u0);
    float part = c0 * h;
#pragma unroll
    for (int o = G / 2; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o, G);
    if (live && lane == 0) {
      const float y = fmaf(dskip, u0, part);
      if (p.y) p.y[t * p.ld_y + c] = __float2bfloat16(y);
      if (p.y_gated) p.y_gated[t * p.ld_y + c] = __float2bfloat16(y * silu(z0));
    }
  }
}

}  // namespace

cudaError_t launch_causal_conv_silu(const __nv_bfloat16* x, int64_t ld_x, const float* w, const float* bias, int K,
                                    __nv_bfloat16* u, int64_t ld_u, int64_t n, int channels, cudaStream_t stream) {
  if (n <= 0 || channels <= 0 || K <= 0 || !x || !w || !u) return cudaErrorInvalidValue;
  const int64_t total = n * channels;
  conv_silu_kernel<<<unsigned((total + 255) / 256), 256, 0, stream>>>(x, ld_x, w, bias, K, u, ld_u, n, channels);
  return cudaGetLastError();
}

cudaError_t launch_selective_scan(const ScanParams& p, cudaStream_t stream) {
  if (p.n <= 0 || p.channels <= 0 || p.state <= 0 || p.state > 32 || !p.u || !p.dt || !p.dt_bias || !p.A || !p.B ||
      !p.C || !p.D || (!p.y && !p.y_gated) || (p.y_gated && !p.z))
    return cudaErrorInvalidValue;
  if (p.state <= 16) {
    scan_kernel<16><<<unsigned((p.channels + THREADS / 16 - 1) / (THREADS / 16)), THREADS, 0, stream>>>(p);
  } else {
    scan_kernel<32><<<unsigned((p.channels + THREADS / 32 - 1) / (THREADS / 32)), THREADS, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace ds::kern
