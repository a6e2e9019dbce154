// The CPU attention kernels (backend_cpu_attention_kernels.inc) compiled for AVX2 + FMA on x86-64; chosen at run time
// by backend_cpu_attention.cpp when the CPU has both. Only functions with this target attribute live here.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "engine/cpu/detail/backend_cpu_attention.h"

#define DS_KNS avx2
#define DS_KTARGET __attribute__((target("avx2,fma")))
#include "engine/cpu/detail/backend_cpu_attention_kernels.inc"
#endif
