// The one place that decides which attention kernel runs (attn_dispatch.h), and the launcher that takes the choice.
// Host code only. Each rule carries its reason; the numbers are from bench/results (H200 and H100, 2026-11).
#include "attn_dispatch.h"
#include "align.h"

#include <cstdio>

#include "attn_fwd_generic.h"
#include "attn_fwd_sm90.h"
#include "diff_attn_fwd.h"

namespace ds::kern {

namespace {

struct Impl {
  AttnImpl impl;
  const char* name;
};
constexpr Impl kImpls[] = {{AttnImpl::Auto, "auto"},           {AttnImpl::Sm90, "wgmma"},
                           {AttnImpl::MmaBoth, "mma-both"},     {AttnImpl::MmaVsplit, "mma-vsplit"},
                           {AttnImpl::MmaLockstep, "mma-lockstep"}, {AttnImpl::Generic, "generic"},
                           {AttnImpl::None, "none"}};

std::string shape_text(const AttnShape& s) {
  char b[128];
  std::snprintf(b, sizeof b, "%s attention with head_dim %d, %d query / %d kv heads", s.diff ? "differential" : "plain",
                s.d, s.heads, s.kv_heads);
  return b;
}

// The driver keeps about 1 KB of shared memory per CTA for itself.
constexpr int kSmemReservedPerCta = 1024;

bool mma_fits(const AttnDevice& dev, int schedule, int d) {
  const MmaFootprint f = diff_attn_mma_footprint(schedule, d);
  return f.smem > 0 && f.smem <= dev.smem_block && f.ctas_per_sm * (f.smem + kSmemReservedPerCta) <= dev.smem_sm;
}

// Whether `impl` can run the shape on the device: empty when it can, else why not.
std::string cannot_run(AttnImpl impl, const AttnDevice& dev, const AttnShape& s) {
  const bool fused_d = s.d == 64 || s.d == 128;
  switch (impl) {
    case AttnImpl::Sm90:
      if (dev.cc != 90) return "needs a Hopper GPU (compute capability 9.0)";
      if (!dev.sm90a) return "this build's sm_90a code does not run on this device";
      if (!dev.tma) return "the driver's tensor-map encoder is not reachable";
      if (!fused_d) return "built for head_dim 64 and 128 only";
      if (s.heads % 2) return "needs an even number of query heads (two heads per CTA)";
      if (!s.aligned16) return "TMA needs 16-byte aligned pointers and strides";
      if (s.quantized && s.windowed) return "its quantised-logit pass is built without a sliding window";
      return {};
    case AttnImpl::MmaBoth:
    case AttnImpl::MmaVsplit:
    case AttnImpl::MmaLockstep: {
      if (!s.diff && impl == AttnImpl::MmaVsplit) return "V-split shares one V between the maps: differential only";
      if (!s.diff && s.heads % 2) return "needs an even number of query heads (two heads per CTA)";
      if (s.quantized) return "no pass for each row's largest logit (quantised logits)";
      if (dev.cc < 80) return "mma.sync with bf16 needs compute capability 8.0 or newer";
      if (!fused_d) return "built for head_dim 64 and 128 only";
      const int sched = impl == AttnImpl::MmaBoth ? MMA_BOTH : impl == AttnImpl::MmaVsplit ? MMA_VSPLIT : MMA_LOCKSTEP;
      if (impl == AttnImpl::MmaBoth && s.d != 64) return "both maps per warp fit the registers only at head_dim 64";
      if (!mma_fits(dev, sched, s.d)) return "its shared memory does not fit this device";
      return {};
    }
    case AttnImpl::Generic:
      return attn_fwd_generic_supported(s.d) ? std::string{} : "head_dim must be a multiple of 8 up to 256";
    default:
      return "not an implementation";
  }
}

}  // namespace

const char* attn_impl_name(AttnImpl impl) {
  for (const Impl& i : kImpls)
    if (i.impl == impl) return i.name;
  return "?";
}

bool parse_attn_impl(const std::string& name, AttnImpl* out) {
  for (const Impl& i : kImpls)
    if (name == i.name && i.impl != AttnImpl::None) {
      *out = i.impl;
      return true;
    }
  return false;
}

AttnDevice query_attn_device(int device) {
  AttnDevice d;
  int prev = 0;
  if (cudaGetDevice(&prev) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    return d;
  }
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&d.smem_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&d.smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&d.l2_bytes, cudaDevAttrL2CacheSize, device) == cudaSuccess) {
    d.cc = major * 10 + minor;
    d.sm90a = d.cc == 90 && attn_fwd_sm90_code_runs();
    d.tma = d.cc >= 90 && attn_tma_encoder_available();
  } else {
    d = AttnDevice{};
  }
  cudaGetLastError();
  cudaSetDevice(prev);
  return d;
}

AttnShape attn_shape(const AttnParams& p) {
  AttnShape s;
  s.d = p.d;
  s.heads = p.heads;
  s.kv_heads = p.kv_heads;
  s.diff = p.diff;
  s.n = p.n;
  s.batch = p.batch;
  s.quantized = p.logit_bits > 0;
  s.windowed = p.window > 0;
  s.aligned16 = aligned16(p.qkv) && aligned16(p.kv) && aligned16(p.out) && p.row_stride % 8 == 0 &&
                p.out_row_stride % 8 == 0 && p.q_off % 8 == 0 && p.k_off % 8 == 0 && p.v_off % 8 == 0 &&
                p.batch_stride >= 0 && p.out_batch_stride >= 0 &&
                (p.batch <= 1 || (p.batch_stride % 8 == 0 && p.out_batch_stride % 8 == 0));
  return s;
}

AttnChoice select_attn(const AttnDevice& dev, const AttnShape& s, const AttnOptions& opt) {
  AttnChoice c;
  // Shapes no kernel takes.
  if (s.heads <= 0 || s.kv_heads <= 0 || s.heads % s.kv_heads) {
    c.why = shape_text(s) + ": num_attention_heads must be a multiple of num_key_value_heads";
    return c;
  }
  if (s.diff && (s.heads % 2 || s.kv_heads % 2)) {
    c.why = shape_text(s) + ": differential attention needs even query and kv head counts";
    return c;
  }
  if (s.quantized && opt.impl != AttnImpl::Generic) {
    // Quantised logits: the kernels with a pass for each row's largest |logit| before the softmax, whatever was asked.
    const bool hopper = cannot_run(AttnImpl::Sm90, dev, s).empty();
    c.impl = hopper ? AttnImpl::Sm90 : AttnImpl::Generic;
    c.why = hopper ? "quantised logits: the wgmma kernel with its first pass for each row's largest logit"
                   : "quantised logits: the generic kernel (of the fused kernels only the Hopper one has the pass for "
                     "each row's largest logit, and not under a sliding window)";
    if (!hopper && !cannot_run(AttnImpl::Generic, dev, s).empty()) {
      c.impl = AttnImpl::None;
      c.why = shape_text(s) + ": head_dim must be a multiple of 8 up to 256";
      return c;
    }
  } else if (opt.impl != AttnImpl::Auto) {
    const std::string no = cannot_run(opt.impl, dev, s);
    if (!no.empty()) {
      c.why = std::string("attention kernel '") + attn_impl_name(opt.impl) + "' cannot run " + shape_text(s) +
              " here: " + no;
      return c;
    }
    c.impl = opt.impl;
    c.why = "asked for (DS_ATTN_KERNEL or the API)";
  } else if (cannot_run(AttnImpl::Sm90, dev, s).empty()) {
    // Hopper: wgmma + TMA + warp specialisation, 1.3-1.5x FlashDiffAttn_1 (cuDNN) and 2.7-2.8x FlashDiffAttn_2 on
    // the H100/H200; the mma.sync schedules reach 0.82-0.98x FlashDiffAttn_1 there.
    c.impl = AttnImpl::Sm90;
    c.why = "Hopper with sm_90a code: the wgmma + TMA warp-specialised kernel (fastest measured on H100/H200)";
  } else if (cannot_run(AttnImpl::MmaBoth, dev, s).empty()) {
    // d = 64: each warp both maps (or both heads of a plain pair), nothing exchanged, two CTAs per SM: 8-10% faster
    // than V-split.
    c.impl = AttnImpl::MmaBoth;
    c.why = "mma.sync, both maps per warp: the fastest portable schedule at head_dim 64";
  } else if (cannot_run(AttnImpl::MmaVsplit, dev, s).empty()) {
    // Every V fragment feeds both maps: +5-9% over lockstep at d = 128, where its 178 KB fit.
    c.impl = AttnImpl::MmaVsplit;
    c.why = "mma.sync V-split: its shared memory fits, and it beats lockstep by 5-9%";
  } else if (cannot_run(AttnImpl::MmaLockstep, dev, s).empty()) {
    // 160 KB at d = 128 fits an A100's 163 KB (V-split does not); 80 KB at d = 64 fits consumer Ampere/Ada.
    c.impl = AttnImpl::MmaLockstep;
    c.why = "mma.sync lockstep: the schedule whose shared memory fits this device";
  } else if (cannot_run(AttnImpl::Generic, dev, s).empty()) {
    // Everything else: head_dim other than 64/128, odd plain head counts, pre-sm_80 GPUs, too little shared memory.
    c.impl = AttnImpl::Generic;
    c.why = "no fused kernel for this shape on this device: the f32 CUDA-core kernel";
  } else {
    c.why = shape_text(s) + ": head_dim must be a multiple of 8 up to 256";
    return c;
  }
  // Keys per tile of the Hopper kernel: 128 measured 5-8% faster than 64 at d = 64; at d = 128 only 64 fits the
  // register file next to the 64 x 256 accumulator.
  c.block_n = c.impl == AttnImpl::Sm90 && s.d == 64 ? 128 : 64;
  if (c.impl == AttnImpl::Sm90 && s.d == 64 && (opt.block_n == 64 || opt.block_n == 128)) c.block_n = opt.block_n;
  // CTA order: tile-major when the whole launch's K and V fit in half of L2, so spreading over heads costs no L2
  // misses and balances short grids (a 1 x 1024 prompt with 12 heads: a third shorter makespan); head-major keeps
  // the running CTAs on few heads, whose K/V then stay in L2 (faster at 2048 x 8).
  const double kv_bytes = double(s.batch) * s.n * s.kv_heads * s.d * 2 /* K and V */ * 2 /* bf16 */;
  c.tile_major = opt.order == CtaOrder::TileMajor ||
                 (opt.order == CtaOrder::Auto && dev.l2_bytes > 0 && kv_bytes <= 0.5 * dev.l2_bytes);
  c.fixed_max = opt.fixed_max;
  c.quant_row_kernel = opt.quant_row_kernel;
  return c;
}

cudaError_t launch_attn(const AttnChoice& choice, const AttnParams& p, cudaStream_t stream) {
  AttnParams q = p;
  q.tile_major = choice.tile_major;
  q.fixed_max = choice.fixed_max;
  q.quant_row_kernel = choice.quant_row_kernel;
  switch (choice.impl) {
    case AttnImpl::Sm90: return launch_attn_fwd_sm90(q, choice.block_n, stream);
    case AttnImpl::MmaBoth: return launch_attn_mma(q, MMA_BOTH, stream);
    case AttnImpl::MmaVsplit: return launch_attn_mma(q, MMA_VSPLIT, stream);
    case AttnImpl::MmaLockstep: return launch_attn_mma(q, MMA_LOCKSTEP, stream);
    case AttnImpl::Generic: return launch_attn_fwd_generic(q, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace ds::kern
