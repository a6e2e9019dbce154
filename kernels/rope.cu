// RoPE as transformers applies it: q_embed = q * cos + rotate_half(q) * sin with cos/sin = cat(freqs, freqs),
// i.e. for i < d/2:  y[i] = x[i] cos_i - x[i + d/2] sin_i,  y[i + d/2] = x[i + d/2] cos_i + x[i] sin_i.
// The QKV GEMM writes bf16 (as transformers' q/k/v_proj outputs are in a bf16 model) straight into the layer's
// Q/K/V cache; this kernel rotates Q and K there in place, in f32, rounding once (transformers rounds each product).
#include "rope.h"
#include "pdl.cuh"

namespace ds::kern {
namespace {

__global__ void rope_table_kernel(const float* inv_freq, int positions, int half, float2* cs) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(positions) * half) return;
  const int pos = int(i / half), k = int(i % half);
  const float a = float(pos) * inv_freq[k];
  float s, c;
  sincosf(a, &s, &c);  // full-precision sincosf (no fast math): large angles keep their accuracy
  cs[i] = make_float2(c, s);
}

// One block per token, rotating Q and K in place: threads walk (head, i) with i even, so x[i..i+1] and
// x[i+d/2..i+d/2+1] are 4-byte loads, coalesced across the warp (one element at a time when d/2 is odd). V heads
// are not touched.
__global__ void rope_qk_inplace_kernel(__nv_bfloat16* qkv, const float2* cs, int seq_len, int rotated_heads,
                                       int all_heads, int d) {
  const int half = d / 2;
  const int64_t t = blockIdx.x;
  const float2* c_row = cs + int64_t(t % seq_len) * half;
  __nv_bfloat16* x = qkv + t * int64_t(all_heads) * d;
  if (half % 2 == 0) {
    const int pairs = half / 2;
    for (int idx = int(threadIdx.x); idx < rotated_heads * pairs; idx += int(blockDim.x)) {
      const int hh = idx / pairs, k = (idx - hh * pairs) * 2;
      __nv_bfloat162* lo = reinterpret_cast<__nv_bfloat162*>(x + hh * d + k);
      __nv_bfloat162* hi = reinterpret_cast<__nv_bfloat162*>(x + hh * d + k + half);
      const float2 a = __bfloat1622float2(*lo), b = __bfloat1622float2(*hi);
      const float2 c0 = c_row[k], c1 = c_row[k + 1];
      *lo = __floats2bfloat162_rn(a.x * c0.x - b.x * c0.y, a.y * c1.x - b.y * c1.y);
      *hi = __floats2bfloat162_rn(b.x * c0.x + a.x * c0.y, b.y * c1.x + a.y * c1.y);
    }
    return;
  }
  for (int idx = int(threadIdx.x); idx < rotated_heads * half; idx += int(blockDim.x)) {
    const int hh = idx / half, k = idx - hh * half;
    const float a = __bfloat162float(x[hh * d + k]), b = __bfloat162float(x[hh * d + k + half]);
    const float2 c = c_row[k];
    x[hh * d + k] = __float2bfloat16(a * c.x - b * c.y);
    x[hh * d + k + half] = __float2bfloat16(b * c.x + a * c.y);
  }
}

// Decoding: one row [(H + 2 Hkv) d] rotated as above at position *pos (cs null: not rotated) and written to
// dst + *pos * dst_stride; the source row is left as it was.
__global__ void rope_row_store_kernel(const __nv_bfloat16* x, const float2* cs, const int32_t* pos, int rotated_heads,
                                      int all_heads, int d, __nv_bfloat16* dst, int64_t dst_stride) {
  // The decoding attention after this kernel waits for it to complete before reading anything (attn_decode.h): let
  // its CTAs launch now, while this single block runs.
  pdl_launch_dependents();
  const int half = d / 2;
  const int64_t p = *pos;
  __nv_bfloat16* y = dst + p * dst_stride;
  const float2* c_row = cs ? cs + p * half : nullptr;
  for (int idx = int(threadIdx.x); idx < all_heads * half; idx += int(blockDim.x)) {
    const int hh = idx / half, k = idx - hh * half;
    const __nv_bfloat16 a = x[hh * d + k], b = x[hh * d + k + half];
    if (!c_row || hh >= rotated_heads) {
      y[hh * d + k] = a;
      y[hh * d + k + half] = b;
      continue;
    }
    const float af = __bfloat162float(a), bf = __bfloat162float(b);
    const float2 c = c_row[k];
    y[hh * d + k] = __float2bfloat16(af * c.x - bf * c.y);
    y[hh * d + k + half] = __float2bfloat16(bf * c.x + af * c.y);
  }
}

}  // namespace

cudaError_t launch_rope_table(const float* inv_freq, int positions, int half, float2* cos_sin, cudaStream_t stream) {
  const int64_t total = int64_t(positions) * half;
  if (total <= 0) return cudaSuccess;
  rope_table_kernel<<<unsigned((total + 255) / 256), 256, 0, stream>>>(inv_freq, positions, half, cos_sin);
  return cudaGetLastError();
}

cudaError_t launch_rope_qk_inplace(__nv_bfloat16* qkv, const float2* cos_sin, int64_t tokens, int seq_len, int heads,
                                  int kv_heads, int d, cudaStream_t stream) {
  if (tokens <= 0) return cudaSuccess;
  if (d % 2) return cudaErrorInvalidValue;
  rope_qk_inplace_kernel<<<unsigned(tokens), 256, 0, stream>>>(qkv, cos_sin, seq_len, heads + kv_heads,
                                                               heads + 2 * kv_heads, d);
  return cudaGetLastError();
}

cudaError_t launch_rope_row_store(const __nv_bfloat16* row, const float2* cos_sin, const int32_t* pos, int heads,
                                  int kv_heads, int d, __nv_bfloat16* dst, int64_t dst_stride, cudaStream_t stream) {
  if (d % 2) return cudaErrorInvalidValue;
  rope_row_store_kernel<<<1, 256, 0, stream>>>(row, cos_sin, pos, heads + kv_heads, heads + 2 * kv_heads, d, dst,
                                               dst_stride);
  return cudaGetLastError();
}

}  // namespace ds::kern
