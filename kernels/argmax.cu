// See argmax.h. One block (each kernel) of 1024 threads strides over the vector (a vocabulary of 128K floats is 512 KB: a few
// microseconds), keeps the largest value and its first index per thread, then reduces by warps and across warps.
#include "argmax.h"

namespace ds::kern {
namespace {

// (v, i) beats (w, j) when v > w, or v == w and i < j; a NaN or -inf never beats anything.
__device__ __forceinline__ void better(float& v, int& i, float w, int j) {
  if (w > v || (w == v && j >= 0 && (i < 0 || j < i))) {
    v = w;
    i = j;
  }
}

__global__ void __launch_bounds__(1024) argmax_kernel(const float* x, int n, int32_t* out) {
  __shared__ float sv[32];
  __shared__ int si[32];
  float v = -INFINITY;
  int idx = -1;
  for (int k = int(threadIdx.x); k < n; k += 1024) {
    const float w = x[k];
    if (w > v) {  // first index per thread: strides rise, so a later equal value never replaces
      v = w;
      idx = k;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) better(v, idx, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, idx, o));
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = idx;
  }
  __syncthreads();
  if (warp == 0) {
    v = sv[lane];
    idx = si[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      better(v, idx, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, idx, o));
    if (lane == 0) {
      out[0] = idx;
      out[1] = __float_as_int(v);
    }
  }
}

// Block-wide reduction of one value per thread (op: max or sum); every thread gets the result.
template <class T, class Op>
__device__ T block_reduce(T v, Op op, T* shared) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  __syncthreads();  // shared may still be read by a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = shared[lane];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__global__ void __launch_bounds__(1024) token_logprob_kernel(const float* x, int n, int id, double* out) {
  __shared__ float sm[32];
  __shared__ double sd[32];
  float mx = -INFINITY;
  for (int k = int(threadIdx.x); k < n; k += 1024) mx = fmaxf(mx, x[k]);
  mx = block_reduce(mx, [](float a, float b) { return fmaxf(a, b); }, sm);
  float part = 0.f;
  for (int k = int(threadIdx.x); k < n; k += 1024) part += expf(x[k] - mx);
  const double sum = block_reduce(double(part), [](double a, double b) { return a + b; }, sd);
  if (threadIdx.x == 0) *out = double(x[id]) - (double(mx) + log(sum));  // (a NaN or +inf logit: NaN, as on the host)
}

}  // namespace

cudaError_t launch_token_logprob_f32(const float* x, int64_t n, int32_t id, double* out, cudaStream_t stream) {
  if (n <= 0 || n > 0x7fffffff || id < 0 || id >= n) return cudaErrorInvalidValue;
  token_logprob_kernel<<<1, 1024, 0, stream>>>(x, int(n), id, out);
  return cudaGetLastError();
}

cudaError_t launch_argmax_f32(const float* x, int64_t n, int32_t* out, cudaStream_t stream) {
  if (n <= 0 || n > 0x7fffffff) return cudaErrorInvalidValue;
  argmax_kernel<<<1, 1024, 0, stream>>>(x, int(n), out);
  return cudaGetLastError();
}

}  // namespace ds::kern
