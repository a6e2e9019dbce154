// The special-function unit's approximations with denormals flushed: one instruction each (__expf, __logf and the
// IEEE division add range fix-ups and Newton steps that none of the uses need), and SiLU built from them. Their
// relative error (a few f32 ulp) is far below the bf16 rounding every caller applies to its result.
#pragma once

namespace ds::kern {

constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;

__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float lg2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// x / (1 + e^-x): for x below about -88, e^-x is inf and the result -0 (x times rcp(inf) = 0).
__device__ __forceinline__ float silu(float x) { return x * rcp_approx(1.f + ex2_approx(-x * LOG2E)); }

}  // namespace ds::kern
