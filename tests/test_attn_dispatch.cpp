// The attention dispatch rules (kernels/attn_dispatch.h) on described devices: a pure function, so these run
// without a GPU (in CI too) wherever the CUDA backend is built. The device descriptions are the published limits
// of each GPU (cudaDevAttrMaxSharedMemoryPerBlockOptin / PerMultiprocessor, L2 size).
#include <gtest/gtest.h>

#ifndef DS_HAVE_CUDA
TEST(AttnDispatch, NotBuilt) { GTEST_SKIP() << "this build has no CUDA backend"; }
#else

#include <string>

#include "kernels/attn_dispatch.h"

namespace {

using ds::kern::AttnDevice;
using ds::kern::AttnImpl;
using ds::kern::AttnOptions;
using ds::kern::AttnShape;
using ds::kern::select_attn;

AttnDevice hopper(bool sm90a = true) { return {90, 232448, 233472, 50 << 20, sm90a, true}; }
AttnDevice a100() { return {80, 166912, 167936, 40 << 20, false, false}; }
AttnDevice rtx3090() { return {86, 101376, 102400, 6 << 20, false, false}; }
AttnDevice t4() { return {75, 65536, 65536, 4 << 20, false, false}; }

AttnShape shape(int d, bool diff, int heads = 32, int kv_heads = 8, int n = 4096, int batch = 1) {
  AttnShape s;
  s.d = d;
  s.diff = diff;
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.n = n;
  s.batch = batch;
  return s;
}

TEST(AttnDispatch, HopperRunsTheWgmmaKernelForDifferentialAndPlainHeads) {
  for (bool diff : {true, false})
    for (int d : {64, 128}) {
      const auto c = select_attn(hopper(), shape(d, diff));
      EXPECT_EQ(c.impl, AttnImpl::Sm90) << d << " " << diff << ": " << c.why;
      EXPECT_EQ(c.block_n, d == 64 ? 128 : 64);
      EXPECT_FALSE(c.why.empty());
    }
  // Without this build's sm_90a code, the portable kernels run on the same GPU.
  EXPECT_EQ(select_attn(hopper(false), shape(64, true)).impl, AttnImpl::MmaBoth);
  EXPECT_EQ(select_attn(hopper(false), shape(128, true)).impl, AttnImpl::MmaVsplit);
  EXPECT_EQ(select_attn(hopper(false), shape(128, false)).impl, AttnImpl::MmaLockstep);
  // Odd head counts and other widths take the generic kernel; unaligned tensors cannot use TMA.
  EXPECT_EQ(select_attn(hopper(), shape(64, false, 5, 5)).impl, AttnImpl::Generic);
  EXPECT_EQ(select_attn(hopper(), shape(96, true)).impl, AttnImpl::Generic);
  AttnShape unaligned = shape(64, true);
  unaligned.aligned16 = false;
  EXPECT_EQ(select_attn(hopper(), unaligned).impl, AttnImpl::MmaBoth);
}

TEST(AttnDispatch, AmpereClassGpusRunTheMmaScheduleTheirSharedMemoryFits) {
  EXPECT_EQ(select_attn(a100(), shape(64, true)).impl, AttnImpl::MmaBoth);          // 2 x 80 KB fit 164 KB
  EXPECT_EQ(select_attn(a100(), shape(128, true)).impl, AttnImpl::MmaLockstep);     // V-split's 178 KB does not
  EXPECT_EQ(select_attn(rtx3090(), shape(64, true)).impl, AttnImpl::MmaLockstep);   // one 80 KB CTA per SM
  EXPECT_EQ(select_attn(rtx3090(), shape(128, true)).impl, AttnImpl::Generic);      // 160 KB does not fit 99 KB
  EXPECT_EQ(select_attn(a100(), shape(64, false)).impl, AttnImpl::MmaBoth);         // plain heads in pairs
  EXPECT_EQ(select_attn(a100(), shape(128, false)).impl, AttnImpl::MmaLockstep);    // V-split: differential only
  EXPECT_EQ(select_attn(a100(), shape(64, false, 5, 5)).impl, AttnImpl::Generic);   // odd plain head count
  EXPECT_EQ(select_attn(t4(), shape(64, true)).impl, AttnImpl::Generic);            // no bf16 mma.sync before sm_80
}

TEST(AttnDispatch, ForcedImplementationsAreGrantedOnlyWhereTheyRun) {
  AttnOptions o;
  o.impl = AttnImpl::MmaVsplit;
  EXPECT_EQ(select_attn(hopper(), shape(128, true), o).impl, AttnImpl::MmaVsplit);
  o.impl = AttnImpl::MmaLockstep;
  EXPECT_EQ(select_attn(hopper(), shape(64, true), o).impl, AttnImpl::MmaLockstep);
  o.impl = AttnImpl::Generic;
  EXPECT_EQ(select_attn(hopper(), shape(64, false), o).impl, AttnImpl::Generic);
  o.impl = AttnImpl::Sm90;
  const auto no = select_attn(a100(), shape(64, true), o);
  EXPECT_EQ(no.impl, AttnImpl::None);
  EXPECT_NE(no.why.find("Hopper"), std::string::npos) << no.why;
  o.impl = AttnImpl::MmaBoth;
  EXPECT_EQ(select_attn(hopper(), shape(128, true), o).impl, AttnImpl::None);  // registers: d = 64 only
  EXPECT_EQ(select_attn(hopper(), shape(64, false), o).impl, AttnImpl::MmaBoth);  // plain pairs
  o.impl = AttnImpl::MmaVsplit;
  EXPECT_EQ(select_attn(hopper(), shape(128, false), o).impl, AttnImpl::None);  // differential only
}

// Quantised logits need a pass for each row's largest |logit| before the softmax: the Hopper kernel (not under a
// window) and the generic kernel have one, the mma.sync schedules none, whatever was asked for.
TEST(AttnDispatch, QuantisedLogitsRunTheKernelsWithARowMaximumPass) {
  for (bool diff : {true, false})
    for (int d : {64, 128}) {
      AttnShape q = shape(d, diff);
      q.quantized = true;
      EXPECT_EQ(select_attn(hopper(), q).impl, AttnImpl::Sm90) << d << " " << diff;
      for (AttnImpl forced : {AttnImpl::MmaBoth, AttnImpl::MmaLockstep, AttnImpl::Sm90})
        EXPECT_EQ(select_attn(hopper(), q, {forced}).impl, AttnImpl::Sm90);
      EXPECT_EQ(select_attn(hopper(), q, {AttnImpl::Generic}).impl, AttnImpl::Generic);
      EXPECT_EQ(select_attn(a100(), q).impl, AttnImpl::Generic);
      EXPECT_EQ(select_attn(hopper(false), q).impl, AttnImpl::Generic);
      EXPECT_NE(select_attn(a100(), q).why.find("quantised"), std::string::npos);
      q.windowed = true;
      EXPECT_EQ(select_attn(hopper(), q).impl, AttnImpl::Generic);
    }
  AttnShape odd = shape(100, true);
  odd.quantized = true;
  EXPECT_EQ(select_attn(hopper(), odd).impl, AttnImpl::None);
}

TEST(AttnDispatch, ShapesNoKernelTakesSayWhy) {
  const auto odd = select_attn(hopper(), shape(64, true, 6, 3));
  EXPECT_EQ(odd.impl, AttnImpl::None);
  EXPECT_NE(odd.why.find("even"), std::string::npos) << odd.why;
  EXPECT_EQ(select_attn(hopper(), shape(64, false, 6, 4)).impl, AttnImpl::None);  // 6 % 4 != 0
  const auto wide = select_attn(hopper(), shape(264, false));
  EXPECT_EQ(wide.impl, AttnImpl::None);
  EXPECT_NE(wide.why.find("multiple of 8 up to 256"), std::string::npos) << wide.why;
}

TEST(AttnDispatch, CtaOrderFollowsWhetherTheLaunchFitsInL2) {
  // 1 x 1024 tokens, 8 kv heads of 64: 2 MB of K and V, far below half of 50 MB: tile-major.
  EXPECT_TRUE(select_attn(hopper(), shape(64, true, 32, 8, 1024, 1)).tile_major);
  // 8 x 16384 tokens: 256 MB: head-major.
  EXPECT_FALSE(select_attn(hopper(), shape(64, true, 32, 8, 16384, 8)).tile_major);
  AttnOptions o;
  o.order = ds::kern::CtaOrder::HeadMajor;
  EXPECT_FALSE(select_attn(hopper(), shape(64, true, 32, 8, 1024, 1), o).tile_major);
  o.order = ds::kern::CtaOrder::TileMajor;
  EXPECT_TRUE(select_attn(hopper(), shape(64, true, 32, 8, 16384, 8), o).tile_major);
  o = {};
  o.block_n = 64;
  EXPECT_EQ(select_attn(hopper(), shape(64, true), o).block_n, 64);
  EXPECT_EQ(select_attn(hopper(), shape(128, true), o).block_n, 64);
}

TEST(AttnDispatch, NamesRoundTrip) {
  for (AttnImpl i : {AttnImpl::Auto, AttnImpl::Sm90, AttnImpl::MmaBoth, AttnImpl::MmaVsplit, AttnImpl::MmaLockstep,
                     AttnImpl::Generic}) {
    AttnImpl back = AttnImpl::None;
    ASSERT_TRUE(ds::kern::parse_attn_impl(ds::kern::attn_impl_name(i), &back)) << ds::kern::attn_impl_name(i);
    EXPECT_EQ(back, i);
  }
  AttnImpl x;
  EXPECT_FALSE(ds::kern::parse_attn_impl("fast", &x));
  EXPECT_FALSE(ds::kern::parse_attn_impl("none", &x));
}

}  // namespace

#endif
