// Element types of safetensors files and the conversions the engine needs (bf16/f16 <-> f32).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace ds {

enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL, F8_E4M3, F8_E5M2, U16, U32, U64, Unknown };

DType dtype_from_string(std::string_view s);  // Unknown when the name is not a safetensors dtype
const char* dtype_name(DType t);
size_t dtype_size(DType t);  // bytes per element; 0 for Unknown

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

}  // namespace ds
