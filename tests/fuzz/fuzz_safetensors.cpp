// Fuzz the safetensors header validation and tensor reads.
#include "engine/core/error.h"
#include "engine/core/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dsfuzz::MemFile f(data, size);
  try {
    ds::SafetensorsFile st(f.path());
    for (const auto& [name, t] : st.tensors()) {
      if (t.numel() > (1 << 16)) continue;
      if (t.dtype == ds::DType::F32 || t.dtype == ds::DType::F16 || t.dtype == ds::DType::BF16 ||
          t.dtype == ds::DType::F64 || t.dtype == ds::DType::I32 || t.dtype == ds::DType::I64)
        (void)ds::tensor_to_f32(t);
    }
  } catch (const ds::Error&) {
  }
  return 0;
}
