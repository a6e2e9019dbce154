// Which attention kernel runs: one pure function from explicit inputs (the device's capabilities, the shape, the
// options) to one implementation, with the reason for each rule beside it, and one launcher that takes the choice.
// Kernels read no environment; the CUDA backend parses its overrides once (README, "Choosing the attention kernel").
//
// What ships, and which hardware reaches it by default (d = head_dim):
//   Sm90        attn_fwd_sm90.cu: wgmma + TMA, a producer warpgroup and two consumer warpgroups taking turns.
//               Hopper (compute capability 9.0, this build's sm_90a code), d = 64 or 128, differential heads and
//               plain heads (two plain heads per CTA, one per consumer warpgroup; H even).
//   MmaBoth     diff_attn_fwd.cu schedule 4: mma.sync, each warp both maps of 16 rows (plain: both heads of a
//               pair). d = 64, sm_80+ with room for two 80 KB CTAs per SM (A100; Hopper without the sm_90a path).
//   MmaVsplit   schedule 2: mma.sync, the two maps' warps swap P and split V's columns. Differential only. d = 128
//               where 178 KB per CTA fits (sm_90 without sm_90a code, sm_100).
//   MmaLockstep schedule 1: mma.sync, each warp one map (plain: one head) over its V. Where nothing above fits:
//               d = 128 on an A100 (163 KB), d = 64 on consumer Ampere/Ada (99 KB); plain heads at d = 128.
//   Generic     attn_fwd_generic.cu: f32 on CUDA cores, one warp per query row. Any d that is a multiple of 8 up to
//               256 (the fused kernels take 64 and 128), odd plain head counts, pre-sm_80 GPUs; also the reference
//               the tests hold the fused kernels against.
// Every one of them takes a sliding window and K/V from a separate buffer (AttnParams::window, ::kv), so neither
// changes the choice. Quantised logits (AttnParams::logit_bits) need a pass for each row's largest |logit| before the
// softmax: Sm90 has one (without a window), Generic has one; the mma.sync schedules have none, so a quantised layer
// takes Sm90 where it can run and Generic otherwise, whichever kernel was asked for.
#pragma once
#include <string>

#include "attn_params.h"

namespace ds::kern {

enum class AttnImpl { Auto, Sm90, MmaBoth, MmaVsplit, MmaLockstep, Generic, None };

// "auto", "wgmma", "mma-both", "mma-vsplit", "mma-lockstep", "generic", "none": the names DS_ATTN_KERNEL takes.
const char* attn_impl_name(AttnImpl impl);
// false when `name` names no implementation.
bool parse_attn_impl(const std::string& name, AttnImpl* out);

// What select_attn reads of a device, queried once per device (query_attn_device).
struct AttnDevice {
  int cc = 0;                // compute capability, major * 10 + minor
  int smem_block = 0;        // opt-in shared memory per block, bytes
  int smem_sm = 0;           // shared memory per SM, bytes
  int l2_bytes = 0;
  bool sm90a = false;        // this build's sm_90a code runs here (a probe kernel says so)
  bool tma = false;          // the driver's tensor-map encoder is reachable
};
// Throws nothing: on a failed query the fields stay 0/false (and only Generic is chosen).
AttnDevice query_attn_device(int device);

struct AttnShape {
  int d = 0, heads = 0, kv_heads = 0;
  bool diff = true;
  int n = 0, batch = 1;   // tokens per sequence and sequences of the launch (the CTA order depends on them)
  bool aligned16 = true;  // input (qkv, and kv when set) and output pointers and strides 16-byte aligned (TMA's rule)
  bool quantized = false; // AttnParams::logit_bits > 0: Sm90 (its first pass) or Generic; Sm90 not under a window
  bool windowed = false;  // AttnParams::window > 0
};
// The shape of a launch as select_attn needs it.
AttnShape attn_shape(const AttnParams& p);

enum class CtaOrder { Auto, HeadMajor, TileMajor };

// Overrides for benchmarks and tests; the defaults are what users get.
struct AttnOptions {
  AttnImpl impl = AttnImpl::Auto;  // DS_ATTN_KERNEL
  int block_n = 0;                 // DS_ATTN_BN: keys per tile of Sm90 at d = 64 (64 or 128; 0 = the rule's)
  CtaOrder order = CtaOrder::Auto; // DS_ATTN_ORDER
  bool fixed_max = true;           // DS_ATTN_FIXMAX=0: Sm90 takes the running row maximum on every key tile
  bool quant_row_kernel = true;    // DS_ATTN_QUANT_ONE_KERNEL=1: quantised Sm90 takes its rows' |logit| maxima from
                                   // its own first pass instead of the row-maximum kernel
};

struct AttnChoice {
  AttnImpl impl = AttnImpl::None;
  int block_n = 64;         // Sm90 at d = 64: 64 or 128 keys per tile; every other kernel 64
  bool tile_major = false;  // CTA order (attn_params.h, CtaTile)
  bool fixed_max = true;    // Sm90: the first pass keeps the diagonal tile's row maxima (attn_fwd_sm90.cu)
  bool quant_row_kernel = true;  // quantised Sm90: the rows' |logit| maxima from the row-maximum kernel
  std::string why;          // the rule that decided, or why nothing can run the shape (impl None)
};

// Pure: the same inputs give the same choice. A forced impl that cannot run the shape gives None with the reason.
AttnChoice select_attn(const AttnDevice& dev, const AttnShape& shape, const AttnOptions& opt = {});

// Launches the chosen kernel for p (whose shape must be the one the choice was made for); p.tile_major is taken
// from the choice. cudaErrorInvalidValue for None or a shape the kernel does not take.
cudaError_t launch_attn(const AttnChoice& choice, const AttnParams& p, cudaStream_t stream);

}  // namespace ds::kern
