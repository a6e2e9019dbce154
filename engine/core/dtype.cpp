// Element-type names and half-precision conversions.
#include "engine/core/dtype.h"

#include <cmath>

namespace ds {

namespace {
struct Row {
  DType t;
  const char* name;
  size_t size;
};
constexpr Row kTypes[] = {
    {DType::F64, "F64", 8},   {DType::F32, "F32", 4},         {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2}, {DType::I64, "I64", 8},         {DType::I32, "I32", 4},
    {DType::I16, "I16", 2},   {DType::I8, "I8", 1},           {DType::U8, "U8", 1},
    {DType::BOOL, "BOOL", 1}, {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
    {DType::U16, "U16", 2},   {DType::U32, "U32", 4},         {DType::U64, "U64", 8},
};
}  // namespace

DType dtype_from_string(std::string_view s) {
  for (const Row& r : kTypes)
    if (s == r.name) return r.t;
  return DType::Unknown;
}

const char* dtype_name(DType t) {
  for (const Row& r : kTypes)
    if (r.t == t) return r.name;
  return "unknown";
}

size_t dtype_size(DType t) {
  for (const Row& r : kTypes)
    if (r.t == t) return r.size;
  return 0;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: value = man * 2^-24
      float f = std::ldexp(float(man), -24);
      std::memcpy(&u, &f, 4);
      u |= sign;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00u;
  if (a >= 65520.f) return sign | 0x7c00u;  // rounds to infinity
  if (a < 6.103515625e-05f) {               // subnormal half: round(a / 2^-24)
    return sign | uint16_t(std::nearbyint(a * 16777216.f));
  }
  uint32_t e = ((u >> 23) & 0xffu) - 112;
  uint32_t m = u & 0x7fffffu;
  uint32_t r = (e << 10) | (m >> 13);
  const uint32_t rest = m & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (r & 1u))) ++r;  // round to nearest even
  return sign | uint16_t(r);
}

}  // namespace ds
