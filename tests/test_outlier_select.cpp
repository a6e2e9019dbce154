// The outlier statistics' radix select (engine/core/outlier_select.h) against std::nth_element on fresh random values
// (heavy tails, ties, zeros, negative values): exact equality of every rank, and of the summary's top and median; and
// the CUDA passes (kernels/outlier_count.cu) against the host passes on the same values, where a GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/outlier_select.h"
#include "engine/session/session_outliers.h"
#include "tests/test_util.h"

#ifdef DS_HAVE_CUDA
#include "kernels/attn_fwd_sm90.h"
#include "kernels/outlier_count.h"
#include "tests/test_cuda_util.h"
#endif

namespace {

std::vector<float> values(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::student_t_distribution<float> heavy(1.5f);
  std::uniform_int_distribution<int> pick(0, 9);
  std::vector<float> v(n);
  for (float& x : v) {
    const int k = pick(g);
    x = k == 0 ? 0.f : k == 1 ? 3.25f : heavy(g) * (k == 2 ? 100.f : 1.f);  // zeros and a repeated value: ties
  }
  return v;
}

// Runs the finder's passes over v on the host.
void find(ds::RankFinder& f, const std::vector<float>& v) {
  while (!f.done()) {
    const ds::RadixPass p = f.pass();
    std::vector<uint64_t> counts(size_t(p.histograms()) * size_t(p.bins()), 0);
    ds::radix_count(v.data(), int64_t(v.size()), p, counts.data());
    f.take(counts);
  }
}

}  // namespace

TEST(OutlierSelect, EveryRankEqualsNthElement) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    const std::vector<float> v = values(50000 + seed * 777, seed);
    std::vector<float> a(v.size());
    std::transform(v.begin(), v.end(), a.begin(), [](float x) { return std::fabs(x); });
    std::vector<uint64_t> ranks = {0, 1, 17, a.size() / 2, a.size() - 101, a.size() - 2, a.size() - 1};
    ds::RankFinder f(ranks);
    find(f, v);
    for (size_t i = 0; i < ranks.size(); ++i) {
      std::vector<float> b = a;
      std::nth_element(b.begin(), b.begin() + long(ranks[i]), b.end());
      EXPECT_EQ(f.value(i), b[ranks[i]]) << "seed " << seed << " rank " << ranks[i];
    }
  }
}

// Two passes place each rank to its 24 leading bits: the value given is within 2^-17 of the rank's, relatively, and
// the floor (the interval's smallest value) at most the rank's; 0 stays 0.
TEST(OutlierSelect, TwoPassesPlaceARankWithin2ToTheMinus17) {
  for (uint32_t seed : {4u, 5u}) {
    const std::vector<float> v = values(40000 + seed * 999, seed);
    std::vector<float> a(v.size());
    std::transform(v.begin(), v.end(), a.begin(), [](float x) { return std::fabs(x); });
    std::sort(a.begin(), a.end());
    std::vector<uint64_t> ranks = {0, 7, a.size() / 3, a.size() / 2, a.size() - 100, a.size() - 1};
    ds::RankFinder f(ranks, 2);
    find(f, v);
    for (size_t i = 0; i < ranks.size(); ++i) {
      const float want = a[ranks[i]];
      EXPECT_LE(f.floor_value(i), want) << "rank " << ranks[i];
      if (want == 0.f) EXPECT_EQ(f.value(i), 0.f) << "rank " << ranks[i];
      else EXPECT_LE(std::fabs(double(f.value(i)) - double(want)), 0x1p-17 * double(want)) << "rank " << ranks[i];
    }
  }
  EXPECT_THROW(ds::RankFinder({1}, 1), ds::Error);
}

TEST(OutlierSelect, TopMedianSummary) {
  const std::vector<float> v = values(12345, 9);
  std::vector<float> a(v.size());
  std::transform(v.begin(), v.end(), a.begin(), [](float x) { return std::fabs(x); });
  std::sort(a.begin(), a.end());
  ds::RankFinder f(ds::top_median_ranks(a.size()));
  find(f, v);
  EXPECT_EQ(f.value(0), a[a.size() - 100]);
  EXPECT_EQ(double(f.value(1)) + double(f.value(2)), double(a[(a.size() - 1) / 2]) + double(a[a.size() / 2]));
  // fewer values than a rank: the finder still places the ranks it has
  ds::RankFinder small(ds::top_median_ranks(7));
  find(small, std::vector<float>{5, -1, 2, 8, 0, 3, 3});
  EXPECT_EQ(small.value(0), 0.f);  // rank max(0, 7 - 100) = the smallest
  EXPECT_EQ(small.value(1), 3.f);
  EXPECT_EQ(small.value(2), 3.f);
}

#ifdef DS_HAVE_CUDA
// Every pass's counts and the collected values of the device kernels equal the host's, on a dense array and on a
// chunk of causal logit rows (two maps, a sliding window, rows not starting at 0).
TEST(OutlierSelect, CudaCountsEqualTheHost) {
  SKIP_WITHOUT_DEVICE();
  const int groups = 4, rows = 37, n = 301, row0 = 200, window = 150;
  const std::vector<float> v = values(size_t(groups) * rows * n, 5);
  const ds::cuda::DeviceBuffer dx = to_device(v);
  for (bool causal : {false, true}) {
    ds::kern::OutlierCells c;
    c.x = dx.as<float>();
    if (causal) c.groups = groups, c.rows = rows, c.n = n, c.nmaps = 2, c.causal = true, c.row0 = row0, c.window = window;
    else c.n = int64_t(v.size());
    // the host's view of the same cells, per map
    std::vector<float> cells[2];
    for (int64_t i = 0; i < int64_t(v.size()); ++i) {
      int m = 0;
      if (causal) {
        const int64_t k = i % n, r = (i / n) % rows, g = i / (int64_t(n) * rows), row = row0 + r;
        if (k > row || k < std::max<int64_t>(0, row - window + 1)) continue;
        m = int(g % 2);
      }
      cells[m].push_back(v[size_t(i)]);
    }
    const int nmaps = causal ? 2 : 1;
    ds::RankFinder f(ds::top_median_ranks(cells[0].size()));
    for (int pass = 0; pass < ds::RankFinder::kPasses; ++pass) {
      const ds::RadixPass p = f.pass();
      const size_t per = size_t(p.histograms()) * size_t(p.bins());
      std::vector<uint64_t> want(nmaps * per, 0);
      for (int m = 0; m < nmaps; ++m) ds::radix_count(cells[m].data(), int64_t(cells[m].size()), p, want.data() + m * per);
      ds::cuda::DeviceBuffer pre = to_device(p.prefixes);
      ds::cuda::DeviceBuffer cnt(nmaps * per * 8, "counts");
      DS_CUDA_CHECK(cudaMemset(cnt.get(), 0, nmaps * per * 8));
      DS_CUDA_CHECK(ds::kern::launch_outlier_count(c, p.shift, p.width, pre.as<uint32_t>(), int(p.prefixes.size()),
                                                    cnt.as<unsigned long long>(), nullptr));
      std::vector<uint64_t> got(nmaps * per);
      DS_CUDA_CHECK(cudaMemcpy(got.data(), cnt.get(), got.size() * 8, cudaMemcpyDeviceToHost));
      ASSERT_EQ(got, want) << "pass " << pass << (causal ? " (logit rows)" : " (dense)");
      f.take(std::vector<uint64_t>(want.begin(), want.begin() + long(per)));
    }
    const std::vector<float> thr(2, f.value(0));
    const int cap = 4096;
    ds::cuda::DeviceBuffer dthr = to_device(thr), out(size_t(nmaps) * cap * 4, "values"), found(8, "found");
    DS_CUDA_CHECK(cudaMemset(found.get(), 0, 8));
    DS_CUDA_CHECK(ds::kern::launch_outlier_collect(c, dthr.as<float>(), out.as<float>(), cap, found.as<unsigned>(), nullptr));
    std::vector<unsigned> nf(2);
    DS_CUDA_CHECK(cudaMemcpy(nf.data(), found.get(), 8, cudaMemcpyDeviceToHost));
    std::vector<float> got(nf[0]);
    DS_CUDA_CHECK(cudaMemcpy(got.data(), out.get(), got.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<float> want;
    for (float x : cells[0])
      if (std::fabs(x) >= thr[0]) want.push_back(std::fabs(x));
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    EXPECT_EQ(got, want);
    EXPECT_GE(got.size(), 100u);
    // The same collection riding on the last counting pass (launch_outlier_count's OutlierCollect): the same values.
    const ds::RadixPass p{0, 7, {}};
    const size_t per = size_t(nmaps) * size_t(p.bins());
    ds::cuda::DeviceBuffer cnt(per * 8, "counts");
    DS_CUDA_CHECK(cudaMemset(cnt.get(), 0, per * 8));
    DS_CUDA_CHECK(cudaMemset(found.get(), 0, 8));
    DS_CUDA_CHECK(ds::kern::launch_outlier_count(c, p.shift, p.width, nullptr, 0, cnt.as<unsigned long long>(), nullptr,
                                                  {dthr.as<float>(), out.as<float>(), cap, found.as<unsigned>()}));
    std::vector<unsigned> nf2(2);
    DS_CUDA_CHECK(cudaMemcpy(nf2.data(), found.get(), 8, cudaMemcpyDeviceToHost));
    EXPECT_EQ(nf2, nf);
    std::vector<float> got2(nf2[0]);
    DS_CUDA_CHECK(cudaMemcpy(got2.data(), out.get(), got2.size() * 4, cudaMemcpyDeviceToHost));
    std::sort(got2.begin(), got2.end());
    EXPECT_EQ(got2, want);
  }
}

// The fused pass over attention logits on Hopper (launch_logit_pass_sm90: Q K^T on the tensor cores, each value
// counted where it is computed) against the host's counts of the same cells. Q and K hold multiples of 1/4 up to 4
// and the scale is a power of two, so every logit is exact in f32 whatever the order of the sums, and the counts
// must be equal, digit for digit: differential and plain heads (GQA), d = 64 and 128, with and without a sliding
// window, prompts of 1 to 4 query blocks of 256 with partial last blocks; a pass over more prefixes than shared
// memory holds (the rest counted in global memory); the collection alone and riding on a counting pass.
TEST(OutlierSelect, CudaLogitPassEqualsTheHost) {
  SKIP_WITHOUT_DEVICE();
  if (!ds::kern::attn_fwd_sm90_code_runs() || !ds::kern::attn_tma_encoder_available())
    GTEST_SKIP() << "the fused logit pass runs on Hopper (sm_90a code and the driver's tensor-map encoder)";
  struct Case {
    int d;
    bool diff;
    int window, n;
  };
  std::mt19937 g(11);
  for (const Case cs : {Case{64, true, 0, 700}, Case{64, false, 0, 300}, Case{128, true, 0, 513},
                        Case{128, false, 45, 700}, Case{64, true, 45, 37}, Case{64, true, 300, 1000},
                        Case{128, true, 0, 1}}) {
    const int H = 4, Hkv = 2, d = cs.d, n = cs.n, nmaps = cs.diff ? 2 : 1, Hv = cs.diff ? H / 2 : H;
    const int64_t stride = int64_t(H + 2 * Hkv) * d;
    std::uniform_int_distribution<int> q4(-16, 16);
    std::vector<int> qi(size_t(n) * size_t(stride));
    for (int& x : qi) x = q4(g);
    std::vector<__nv_bfloat16> qkv(qi.size());
    for (size_t i = 0; i < qi.size(); ++i) qkv[i] = __float2bfloat16(float(qi[i]) / 4.f);
    const ds::cuda::DeviceBuffer dqkv = to_device(qkv);
    ds::kern::AttnParams p;
    p.qkv = dqkv.as<__nv_bfloat16>();
    p.row_stride = stride, p.batch_stride = int64_t(n) * stride;
    p.q_off = 0, p.k_off = int64_t(H) * d, p.v_off = int64_t(H + Hkv) * d;
    p.n = n, p.heads = H, p.kv_heads = Hkv, p.d = d, p.diff = cs.diff, p.window = cs.window;
    p.scale = d == 64 ? 0.125f : 0.0625f;
    const std::string what = "d " + std::to_string(d) + (cs.diff ? " diff" : " plain") + " window " +
                             std::to_string(cs.window) + " n " + std::to_string(n);
    std::vector<float> cells[2];  // the host's cells per map, exact
    for (int j = 0; j < Hv; ++j)
      for (int m = 0; m < nmaps; ++m) {
        const ds::kern::ViewHeadMap hm = ds::kern::view_head_map(cs.diff, j, H, Hkv);
        for (int r = 0; r < n; ++r)
          for (int k = ds::kern::window_first_key(cs.window, r); k <= r; ++k) {
            int64_t dot = 0;  // in sixteenths
            for (int e = 0; e < d; ++e)
              dot += int64_t(qi[size_t(r * stride + p.q_off + hm.q[m] * d + e)]) *
                     qi[size_t(k * stride + p.k_off + hm.k[m] * d + e)];
            cells[m].push_back(std::fabs(float(double(dot) / 16.0 * double(p.scale))));
          }
      }
    auto device_pass = [&](const ds::RadixPass& rp, const ds::kern::OutlierCollect& k) {
      const size_t per = size_t(rp.histograms()) * size_t(rp.bins());
      ds::cuda::DeviceBuffer pre = to_device(rp.prefixes.empty() ? std::vector<uint32_t>{0} : rp.prefixes);
      ds::cuda::DeviceBuffer cnt(size_t(nmaps) * per * 8, "counts");
      DS_CUDA_CHECK(cudaMemset(cnt.get(), 0xff, size_t(nmaps) * per * 8));  // poisoned, then cleared
      DS_CUDA_CHECK(cudaMemset(cnt.get(), 0, size_t(nmaps) * per * 8));
      ds::kern::LogitPass lp;
      lp.shift = rp.shift, lp.width = rp.width, lp.prefixes = pre.as<uint32_t>(), lp.nprefix = int(rp.prefixes.size());
      lp.counts = cnt.as<unsigned long long>(), lp.collect = k;
      DS_CUDA_CHECK(ds::kern::launch_logit_pass_sm90(p, lp, nullptr));
      DS_CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<uint64_t> got(size_t(nmaps) * per);
      DS_CUDA_CHECK(cudaMemcpy(got.data(), cnt.get(), got.size() * 8, cudaMemcpyDeviceToHost));
      return got;
    };
    auto host_pass = [&](const ds::RadixPass& rp) {
      const size_t per = size_t(rp.histograms()) * size_t(rp.bins());
      std::vector<uint64_t> want(size_t(nmaps) * per, 0);
      for (int m = 0; m < nmaps; ++m)
        ds::radix_count(cells[m].data(), int64_t(cells[m].size()), rp, want.data() + size_t(m) * per);
      return want;
    };
    // The passes a selection of map 1's top and middles makes.
    ds::RankFinder f(ds::top_median_ranks(cells[0].size()));
    for (int pass = 0; pass < ds::RankFinder::kPasses; ++pass) {
      const ds::RadixPass rp = f.pass();
      const std::vector<uint64_t> want = host_pass(rp), got = device_pass(rp, {});
      ASSERT_EQ(got, want) << what << " pass " << pass;
      f.take(std::vector<uint64_t>(want.begin(), want.begin() + long(want.size() / size_t(nmaps))));
    }
    // Every 12-bit prefix present, in descending order (more than shared memory holds at d = 128: the rest in global
    // memory).
    std::vector<uint32_t> tops;
    for (int m = 0; m < nmaps; ++m)
      for (float x : cells[m]) tops.push_back(ds::abs_bits(x) >> 19);
    std::sort(tops.begin(), tops.end(), std::greater<uint32_t>());
    tops.erase(std::unique(tops.begin(), tops.end()), tops.end());
    const ds::RadixPass many{7, 12, tops};
    ASSERT_EQ(device_pass(many, {}), host_pass(many)) << what << " (" << tops.size() << " prefixes)";
    // The collection: every value at or above each map's 20th largest, alone and with a counting pass.
    std::vector<float> thr(2, 0.f), want[2];
    for (int m = 0; m < nmaps; ++m) {
      std::vector<float> v = cells[m];
      std::sort(v.begin(), v.end(), std::greater<float>());
      thr[size_t(m)] = v[std::min<size_t>(19, v.size() - 1)];
      for (float x : cells[m])
        if (x >= thr[size_t(m)]) want[m].push_back(x);
      std::sort(want[m].begin(), want[m].end());
    }
    const int cap = 4096;
    ds::cuda::DeviceBuffer dthr = to_device(thr), out(size_t(nmaps) * cap * 4, "values"), found(8, "found");
    for (const ds::RadixPass& rp : {ds::RadixPass{0, 0, {}}, ds::RadixPass{19, 12, {}}}) {
      DS_CUDA_CHECK(cudaMemset(found.get(), 0, 8));
      const std::vector<uint64_t> got = device_pass(rp, {dthr.as<float>(), out.as<float>(), cap, found.as<unsigned>()});
      if (rp.width > 0) EXPECT_EQ(got, host_pass(rp)) << what;
      std::vector<unsigned> nf(2);
      DS_CUDA_CHECK(cudaMemcpy(nf.data(), found.get(), 8, cudaMemcpyDeviceToHost));
      for (int m = 0; m < nmaps; ++m) {
        ASSERT_EQ(nf[size_t(m)], want[m].size()) << what << " map " << m;
        std::vector<float> v(nf[size_t(m)]);
        DS_CUDA_CHECK(cudaMemcpy(v.data(), out.as<float>() + size_t(m) * cap, v.size() * 4, cudaMemcpyDeviceToHost));
        std::sort(v.begin(), v.end());
        EXPECT_EQ(v, want[m]) << what << " map " << m << " width " << rp.width;
      }
    }
  }
}

// What the fused logit pass costs (DS_OUTLIER_PERF=1; skipped otherwise): one layer of the kajuma shape (32 query
// heads, 8 kv heads, d = 64, differential) at 4K and 32K tokens, Q and K ~ N(0, 3) (|logit| median near 2, as the
// random kajuma checkpoint's): a collection that finds nothing (Q K^T and one compare a cell), the first pass, and
// the two later passes with the prefixes of each map's middle and top.
TEST(OutlierSelect, CudaLogitPassTimes) {
  SKIP_WITHOUT_DEVICE();
  if (!std::getenv("DS_OUTLIER_PERF")) GTEST_SKIP() << "set DS_OUTLIER_PERF=1 to time the fused logit pass";
  if (!ds::kern::attn_fwd_sm90_code_runs() || !ds::kern::attn_tma_encoder_available())
    GTEST_SKIP() << "the fused logit pass runs on Hopper";
  for (int n : {4096, 32768}) {
    const int H = 32, Hkv = 8, d = 64;
    const int64_t stride = int64_t(H + 2 * Hkv) * d;
    std::vector<__nv_bfloat16> qkv(size_t(n) * size_t(stride));
    uint64_t x = 88172645463325252ull;
    for (auto& v : qkv) {
      float u = 0;
      for (int k = 0; k < 4; ++k) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        u += float(x >> 40) / float(1 << 24);
      }
      v = __float2bfloat16((u - 2.f) * 1.732f * 1.732f);  // (sum of 4 uniforms: variance 1/3)
    }
    const ds::cuda::DeviceBuffer dqkv = to_device(qkv);
    ds::kern::AttnParams p;
    p.qkv = dqkv.as<__nv_bfloat16>();
    p.row_stride = stride, p.batch_stride = int64_t(n) * stride;
    p.q_off = 0, p.k_off = int64_t(H) * d, p.v_off = int64_t(H + Hkv) * d;
    p.n = n, p.heads = H, p.kv_heads = Hkv, p.d = d, p.diff = true, p.scale = 0.125f;
    ds::cuda::DeviceBuffer cnt(size_t(2) * 8 * 4096 * 8, "counts"), thr(8, "thr"), out(2 * 1024 * 4, "out"),
        found(8, "found"), pre(64 * 4, "prefixes");
    const float big[2] = {1e30f, 1e30f};
    DS_CUDA_CHECK(cudaMemcpy(thr.get(), big, 8, cudaMemcpyHostToDevice));
    cudaEvent_t e0, e1;
    DS_CUDA_CHECK(cudaEventCreate(&e0));
    DS_CUDA_CHECK(cudaEventCreate(&e1));
    auto timed = [&](const ds::kern::LogitPass& lp) {
      float best = 1e30f;
      for (int r = 0; r < 4; ++r) {
        DS_CUDA_CHECK(cudaMemset(cnt.get(), 0, cnt.bytes()));
        DS_CUDA_CHECK(cudaMemset(found.get(), 0, 8));
        DS_CUDA_CHECK(cudaEventRecord(e0));
        const cudaError_t e = ds::kern::launch_logit_pass_sm90(p, lp, nullptr);
        DS_CUDA_CHECK(e);
        DS_CUDA_CHECK(cudaEventRecord(e1));
        DS_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        DS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (r > 0) best = std::min(best, ms);
      }
      return best;
    };
    auto counts = [&](size_t k) {
      std::vector<uint64_t> c(k);
      DS_CUDA_CHECK(cudaMemcpy(c.data(), cnt.get(), k * 8, cudaMemcpyDeviceToHost));
      return c;
    };
    ds::kern::LogitPass lp;
    lp.collect = {thr.as<float>(), out.as<float>(), 1024, found.as<unsigned>()};
    const float floor_ms = timed(lp);
    lp.collect = {};
    lp.shift = 19, lp.width = 12, lp.counts = cnt.as<unsigned long long>();
    const float pass0 = timed(lp);
    const std::vector<uint64_t> c0 = counts(2 * 4096);
    // each map's middle and 100th largest's first digits
    std::vector<uint32_t> pfx;
    const uint64_t cells = uint64_t(n) * uint64_t(n + 1) / 2 * uint64_t(H / 2);
    for (int m = 0; m < 2; ++m)
      for (uint64_t rank : {cells / 2, cells - 100}) {
        uint64_t below = 0;
        for (uint32_t dgt = 0; dgt < 4096; ++dgt) {
          const uint64_t k = c0[size_t(m) * 4096 + dgt];
          if (below + k > rank) {
            if (std::find(pfx.begin(), pfx.end(), dgt) == pfx.end()) pfx.push_back(dgt);
            break;
          }
          below += k;
        }
      }
    DS_CUDA_CHECK(cudaMemcpy(pre.get(), pfx.data(), pfx.size() * 4, cudaMemcpyHostToDevice));
    lp.shift = 7, lp.width = 12, lp.prefixes = pre.as<uint32_t>(), lp.nprefix = int(pfx.size());
    const float pass1 = timed(lp);
    const std::vector<uint64_t> c1 = counts(size_t(2) * pfx.size() * 4096);
    std::vector<uint32_t> pfx2;  // the middle's 24-bit prefix of map 0 (the first prefix's busiest digit)
    uint32_t best = 0;
    for (uint32_t dgt = 0; dgt < 4096; ++dgt)
      if (c1[dgt] > c1[best]) best = dgt;
    pfx2.push_back((pfx[0] << 12) | best);
    DS_CUDA_CHECK(cudaMemcpy(pre.get(), pfx2.data(), 4, cudaMemcpyHostToDevice));
    lp.shift = 0, lp.width = 7, lp.nprefix = 1;
    const float pass2 = timed(lp);
    std::printf("logit pass n %d (one layer, 16 view heads x 2 maps): Q K^T + compare %.3f ms; first pass %.3f; "
                "second (%zu prefixes) %.3f; third %.3f ms\n",
                n, floor_ms, pass0, pfx.size(), pass1, pass2);
    DS_CUDA_CHECK(cudaEventDestroy(e0));
    DS_CUDA_CHECK(cudaEventDestroy(e1));
  }
}

// The batched pass over several dense arrays (launch_outlier_count_dense: the hidden states of every layer in one
// launch): each source's counts equal the host's for its own prefixes, over arrays of odd lengths, one not 16-byte
// aligned (the scalar path), each pass's histograms in shared memory or (many prefixes) in global memory; the last
// pass collects each source's values at or above the 100th largest's prefix floor, as RankFinder::below says.
TEST(OutlierSelect, CudaDenseBatchEqualsTheHost) {
  SKIP_WITHOUT_DEVICE();
  const std::vector<size_t> sizes = {100003, 4096, 77777, 9};
  std::vector<std::vector<float>> v;
  std::vector<ds::cuda::DeviceBuffer> dv;
  for (size_t j = 0; j < sizes.size(); ++j) {
    v.push_back(values(sizes[j], 20 + uint32_t(j)));
    std::vector<float> padded = v.back();
    if (j == 2) padded.insert(padded.begin(), 0.f);  // the source starts one float in: not 16-byte aligned
    dv.push_back(to_device(padded));
  }
  std::vector<ds::RankFinder> f;
  for (size_t j = 0; j < sizes.size(); ++j) f.emplace_back(ds::top_median_ranks(sizes[j]));
  for (bool many : {false, true}) {
    for (int pass = 0; pass < ds::RankFinder::kPasses; ++pass) {
      const bool last = pass + 1 == ds::RankFinder::kPasses;
      std::vector<ds::kern::DenseSource> src(sizes.size());
      std::vector<uint32_t> prefixes;
      std::vector<ds::RadixPass> ps;
      size_t at = 0;
      int max_pre = 0;
      for (size_t j = 0; j < sizes.size(); ++j) {
        ds::RadixPass p = f[j].pass();
        // many: 70 prefixes no value has after the finder's (histograms in global memory, prefixes read from it):
        // |x| of 3e37 and above
        if (many && pass > 0)
          for (uint32_t k = 0; k < 70; ++k) p.prefixes.push_back((0xfffu - k) << (pass == 1 ? 0 : 12));
        ps.push_back(p);
        src[j].x = dv[j].as<float>() + (j == 2 ? 1 : 0);
        src[j].count = int64_t(sizes[j]);
        src[j].prefix_at = int(prefixes.size());
        src[j].nprefix = int(p.prefixes.size());
        src[j].counts_at = int64_t(at);
        if (last) src[j].at_least = f[j].floor_value(0), src[j].collect_at = int64_t(j) * 4096, src[j].cap = 4096;
        prefixes.insert(prefixes.end(), p.prefixes.begin(), p.prefixes.end());
        at += size_t(p.histograms()) * size_t(p.bins());
        max_pre = std::max(max_pre, int(p.prefixes.size()));
      }
      ds::cuda::DeviceBuffer dsrc(src.size() * sizeof(src[0]), "sources"), dpre = to_device(prefixes.empty() ? std::vector<uint32_t>{0} : prefixes);
      DS_CUDA_CHECK(cudaMemcpy(dsrc.get(), src.data(), src.size() * sizeof(src[0]), cudaMemcpyHostToDevice));
      ds::cuda::DeviceBuffer cnt(at * 4, "counts"), out(sizes.size() * 4096 * 4, "values"), found(sizes.size() * 4, "found");
      DS_CUDA_CHECK(cudaMemset(cnt.get(), 0, at * 4));
      DS_CUDA_CHECK(cudaMemset(found.get(), 0, sizes.size() * 4));
      DS_CUDA_CHECK(ds::kern::launch_outlier_count_dense(dsrc.as<ds::kern::DenseSource>(), int(sizes.size()), 100003,
                                                          max_pre, ps[0].shift, ps[0].width, dpre.as<uint32_t>(),
                                                          cnt.as<unsigned>(), out.as<float>(), found.as<unsigned>(),
                                                          nullptr));
      std::vector<uint32_t> got32(at);
      DS_CUDA_CHECK(cudaMemcpy(got32.data(), cnt.get(), at * 4, cudaMemcpyDeviceToHost));
      const std::vector<uint64_t> got(got32.begin(), got32.end());
      std::vector<unsigned> nf(sizes.size());
      DS_CUDA_CHECK(cudaMemcpy(nf.data(), found.get(), nf.size() * 4, cudaMemcpyDeviceToHost));
      for (size_t j = 0; j < sizes.size(); ++j) {
        const size_t per = size_t(ps[j].histograms()) * size_t(ps[j].bins());
        std::vector<uint64_t> want(per, 0);
        ds::radix_count(v[j].data(), int64_t(sizes[j]), ps[j], want.data());
        const std::vector<uint64_t> mine(got.begin() + long(src[j].counts_at), got.begin() + long(src[j].counts_at + per));
        ASSERT_EQ(mine, want) << "source " << j << " pass " << pass << (many ? " (global histograms)" : "");
        if (last) {
          std::vector<float> w;
          for (float x : v[j])
            if (std::fabs(x) >= src[j].at_least) w.push_back(std::fabs(x));
          EXPECT_EQ(uint64_t(w.size()), sizes[j] - f[j].below(0)) << "source " << j;
          ASSERT_EQ(nf[j], w.size()) << "source " << j;
          std::vector<float> g(w.size());
          DS_CUDA_CHECK(cudaMemcpy(g.data(), out.as<float>() + j * 4096, g.size() * 4, cudaMemcpyDeviceToHost));
          std::sort(g.begin(), g.end());
          std::sort(w.begin(), w.end());
          EXPECT_EQ(g, w) << "source " << j;
        }
        // the finder moves on with its own prefixes' histograms (the first ones)
        const ds::RadixPass own = f[j].pass();
        f[j].take(std::vector<uint64_t>(want.begin(), want.begin() + long(size_t(own.histograms()) * size_t(own.bins()))));
      }
    }
    for (size_t j = 0; j < sizes.size(); ++j) {  // and finds the ranks nth_element does
      std::vector<float> a(v[j].size());
      std::transform(v[j].begin(), v[j].end(), a.begin(), [](float x) { return std::fabs(x); });
      std::nth_element(a.begin(), a.begin() + long(sizes[j] > 100 ? sizes[j] - 100 : 0), a.end());
      EXPECT_EQ(f[j].value(0), a[sizes[j] > 100 ? sizes[j] - 100 : 0]);
    }
    f.clear();  // the second round starts the finders again
    for (size_t j = 0; j < sizes.size(); ++j) f.emplace_back(ds::top_median_ranks(sizes[j]));
  }
}
#endif

#ifdef DS_HAVE_CUDA
namespace {
// The device selection over sources (device pointer, count), laid out as the CUDA backend lays it out: the table,
// the ranks (each source's top_median_ranks, then the model's two middles), prefixes, counts, the collected values,
// the numbers found and the error flag after them.
struct Selection {
  static constexpr int K = ds::kern::kSelectPrefixes;
  int S, cap;
  std::vector<ds::kern::DenseSource> table;
  std::vector<ds::kern::RankState> ranks;
  uint64_t total = 0;
  int64_t max_count = 0;
  ds::cuda::DeviceBuffer dtab, dranks, pre, cnt, out, found, compact, compact_n, top;
  ds::kern::SelectPlan plan;

  Selection(const std::vector<std::pair<const float*, int64_t>>& src, int cap_)
      : S(int(src.size())), cap(cap_), table(src.size()), ranks(3 * src.size() + 2),
        dtab(src.size() * sizeof(ds::kern::DenseSource), "table"),
        dranks((3 * src.size() + 2) * sizeof(ds::kern::RankState), "ranks"), pre(src.size() * K * 4, "prefixes"),
        cnt(src.size() * K * 4096 * 4, "counts"), out(src.size() * size_t(cap_) * 4, "values"),
        found(src.size() * 4 + 4, "found, error"), top(src.size() * 100 * 4, "top") {
    for (int s = 0; s < S; ++s) {
      const uint64_t n = uint64_t(src[size_t(s)].second);
      table[size_t(s)].x = src[size_t(s)].first;
      table[size_t(s)].count = int64_t(n);
      table[size_t(s)].counts_at = int64_t(s) * K * 4096;
      const std::vector<uint64_t> rk = ds::top_median_ranks(n);
      for (int k = 0; k < 3; ++k) ranks[size_t(3 * s + k)] = ds::kern::RankState{rk[size_t(k)], rk[size_t(k)]};
      total += n;
      max_count = std::max(max_count, int64_t(n));
    }
    const std::vector<uint64_t> all = ds::top_median_ranks(total);
    ranks[size_t(3 * S)] = {all[1], all[1]};
    ranks[size_t(3 * S + 1)] = {all[2], all[2]};
    plan.nsources = S;
    plan.table = dtab.as<ds::kern::DenseSource>();
    plan.prefixes = pre.as<uint32_t>();
    plan.counts = cnt.as<unsigned>();
    plan.ranks = dranks.as<ds::kern::RankState>();
    plan.cap = cap;
    plan.error = reinterpret_cast<int*>(found.as<unsigned>() + S);
  }
  // The compaction after the first pass, with room for `cap_values` values a source (a source with more kept reads
  // its whole values again).
  void compact_into(int64_t cap_values) {
    compact = ds::cuda::DeviceBuffer(size_t(S) * size_t(cap_values) * 4, "compact");
    compact_n = ds::cuda::DeviceBuffer(size_t(S) * 4, "compact counts");
    plan.compact = compact.as<float>();
    plan.compact_cap = cap_values;
    plan.compact_n = compact_n.as<unsigned>();
  }
  // The initial table and ranks uploaded, found and the error flag zeroed, the values poisoned (NaN where nothing is
  // collected); waits.
  void reset() {
    DS_CUDA_CHECK(cudaMemcpy(dtab.get(), table.data(), dtab.bytes(), cudaMemcpyHostToDevice));
    DS_CUDA_CHECK(cudaMemcpy(dranks.get(), ranks.data(), dranks.bytes(), cudaMemcpyHostToDevice));
    DS_CUDA_CHECK(cudaMemset(found.get(), 0, found.bytes()));
    DS_CUDA_CHECK(cudaMemset(out.get(), 0xff, out.bytes()));
    DS_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void launch() {
    DS_CUDA_CHECK(ds::kern::launch_outlier_select_passes(plan, ds::RankFinder::kPasses, ds::kRadixShift,
                                                         ds::kRadixWidth, max_count, out.as<float>(),
                                                         found.as<unsigned>(), nullptr));
  }
};
}  // namespace

// The selection on the device (launch_outlier_select_passes: the counting passes and the RankFinder steps between
// them, queued with no host round trip) against nth_element: each source's 100th largest (through its collected
// values: exactly every |x| at or above it), its two middles, and the middles over every source's values. Sources of
// odd sizes: fewer than 100 values, heavy tails with ties, all zeros and one whose 100th value is tied 3000 times
// (these two: their top only placed at the last pass, more values than the cap: found says so).
// Each time three ways: every pass over the whole values; the later passes over the compaction's copies; and copies
// too small for the larger sources (whose later passes read their whole values again). The last source starts 4
// bytes into its buffer (no float4 reads).
class OutlierSelectCompact : public ::testing::TestWithParam<int64_t> {};
INSTANTIATE_TEST_SUITE_P(Copies, OutlierSelectCompact, ::testing::Values(int64_t(0), int64_t(200000), int64_t(3000)));

TEST_P(OutlierSelectCompact, CudaSelectionEqualsNthElement) {
  SKIP_WITHOUT_DEVICE();
  std::vector<std::vector<float>> v = {values(100003, 31), values(57, 32), std::vector<float>(5000, 0.f),
                                       values(77777, 33), values(20000, 34), values(30001, 35)};
  for (size_t i = 0; i < 3000; ++i) v[4][i * 5] = -1.0e6f;  // 3000 ties at the top of a heavy-tailed set
  const int S = int(v.size()), cap = 1024;
  std::vector<ds::cuda::DeviceBuffer> dv;
  std::vector<std::pair<const float*, int64_t>> src;
  for (const std::vector<float>& x : v) {
    const bool skew = &x == &v.back();
    std::vector<float> y = x;
    if (skew) y.insert(y.begin(), 7.f);  // (not one of the values: the source starts after it)
    dv.push_back(to_device(y));
    src.emplace_back(dv.back().as<float>() + (skew ? 1 : 0), int64_t(x.size()));
  }
  Selection sel(src, cap);
  if (GetParam() > 0) sel.compact_into(GetParam());
  sel.reset();
  sel.launch();
  DS_CUDA_CHECK(cudaMemset(sel.top.get(), 0xff, sel.top.bytes()));
  DS_CUDA_CHECK(ds::kern::launch_outlier_sort_top(sel.plan, sel.out.as<float>(), sel.found.as<unsigned>(),
                                                  sel.top.as<float>(), 100, nullptr));
  DS_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<unsigned> nf(size_t(S) + 1);
  DS_CUDA_CHECK(cudaMemcpy(nf.data(), sel.found.get(), nf.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<ds::kern::RankState> ranks(sel.ranks.size());
  DS_CUDA_CHECK(cudaMemcpy(ranks.data(), sel.dranks.get(), sel.dranks.bytes(), cudaMemcpyDeviceToHost));
  ASSERT_EQ(nf[size_t(S)], 0u) << "error flag";
  auto value = [&](size_t i) {
    float x;
    std::memcpy(&x, &ranks[i].prefix, 4);
    return x;
  };
  if (GetParam() > 0) {  // the copies: every source fits the larger; the zeros (all kept) do not fit the smaller
    std::vector<unsigned> kept(static_cast<size_t>(S));
    DS_CUDA_CHECK(cudaMemcpy(kept.data(), sel.compact_n.get(), kept.size() * 4, cudaMemcpyDeviceToHost));
    for (int s = 0; s < S; ++s) {
      EXPECT_GT(kept[size_t(s)], 0u) << "source " << s;
      if (GetParam() >= 200000) EXPECT_LE(kept[size_t(s)], unsigned(GetParam())) << "source " << s;
    }
    if (GetParam() == 3000) EXPECT_EQ(kept[2], 5000u);
  }
  std::vector<float> every;
  for (int s = 0; s < S; ++s) {
    std::vector<float> a(v[size_t(s)].size());
    std::transform(v[size_t(s)].begin(), v[size_t(s)].end(), a.begin(), [](float x) { return std::fabs(x); });
    every.insert(every.end(), a.begin(), a.end());
    const std::vector<uint64_t> rk = ds::top_median_ranks(a.size());
    std::vector<float> b = a;
    std::nth_element(b.begin(), b.begin() + long(rk[0]), b.end());
    const float hundredth = b[rk[0]];
    for (int k = 1; k < 3; ++k) {
      std::nth_element(b.begin(), b.begin() + long(rk[size_t(k)]), b.end());
      EXPECT_EQ(value(size_t(3 * s + k)), b[rk[size_t(k)]]) << "source " << s << " middle " << k;
    }
    std::vector<float> want;
    for (float x : a)
      if (x >= hundredth) want.push_back(x);
    if (s == 2 || s == 4) {  // a tied top (zeros; 1e6): placed at the last pass, at exactly its 100th value, and
                             // more than cap values at or above it: found counts them all (the caller collects again)
      EXPECT_EQ(value(size_t(3 * s)), hundredth) << "source " << s;
      EXPECT_EQ(nf[size_t(s)], unsigned(want.size())) << "source " << s;
      EXPECT_GT(want.size(), size_t(cap)) << "source " << s;
      continue;
    }
    // a folded source collected at its floor: every value at or above the 100th, and only values at or above the
    // floor (the floor is at most the 100th)
    ASSERT_LE(nf[size_t(s)], unsigned(cap)) << "source " << s;
    std::vector<float> got(nf[size_t(s)]);
    DS_CUDA_CHECK(cudaMemcpy(got.data(), sel.out.as<float>() + size_t(s) * cap, got.size() * 4, cudaMemcpyDeviceToHost));
    std::sort(got.begin(), got.end(), std::greater<float>());
    ASSERT_GE(got.size(), want.size()) << "source " << s;
    std::sort(want.begin(), want.end(), std::greater<float>());
    EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin())) << "source " << s;
    // sorted on the device: the largest 100 (of what it collected), largest first
    const size_t k = std::min<size_t>(100, got.size());
    std::vector<float> top(k);
    DS_CUDA_CHECK(cudaMemcpy(top.data(), sel.top.as<float>() + size_t(s) * 100, k * 4, cudaMemcpyDeviceToHost));
    EXPECT_TRUE(std::equal(top.begin(), top.end(), got.begin())) << "source " << s;
    size_t above = 0;
    for (float x : a) above += x >= got.back();
    EXPECT_EQ(above, got.size()) << "source " << s;
  }
  const std::vector<uint64_t> all = ds::top_median_ranks(sel.total);
  for (int k = 0; k < 2; ++k) {
    std::nth_element(every.begin(), every.begin() + long(all[size_t(1 + k)]), every.end());
    EXPECT_EQ(value(size_t(3 * S + k)), every[all[size_t(1 + k)]]) << "the model's middle " << k;
  }
}
#endif

#ifdef DS_HAVE_CUDA
// The selection's launches alone over 16 sources of 4096 x 2048 heavy-tailed values (one array's values in 16
// buffers, so that no pass reads from L2 what the previous one left), timed by events in the stream, and with the wait
// on the host, without and with the compaction after the first pass (DS_OUTLIER_PERF=1; skipped otherwise). Medians
// of 21, the two ways alternating.
TEST(OutlierSelect, CudaSelectionTimes) {
  SKIP_WITHOUT_DEVICE();
  if (!std::getenv("DS_OUTLIER_PERF")) GTEST_SKIP() << "set DS_OUTLIER_PERF=1 to time the selection";
  constexpr int S = 16;
  const size_t n = size_t(4096) * 2048;
  const std::vector<float> host = values(n, 41);
  std::vector<ds::cuda::DeviceBuffer> xs;
  std::vector<std::pair<const float*, int64_t>> src;
  for (int s = 0; s < S; ++s) {
    xs.push_back(to_device(host));
    src.emplace_back(xs.back().as<float>(), int64_t(n));
  }
  Selection whole(src, 1024), copy(src, 1024);
  copy.compact_into(int64_t(n / 8));
  cudaEvent_t e0, e1;
  DS_CUDA_CHECK(cudaEventCreate(&e0));
  DS_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<double> gpu[2], wall[2];
  for (int rep = 0; rep < 44; ++rep) {
    Selection& sel = rep % 2 ? copy : whole;
    sel.reset();
    const auto t0 = std::chrono::steady_clock::now();
    DS_CUDA_CHECK(cudaEventRecord(e0, nullptr));
    sel.launch();
    DS_CUDA_CHECK(cudaEventRecord(e1, nullptr));
    DS_CUDA_CHECK(cudaEventSynchronize(e1));
    const double w = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    float ms = 0;
    DS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (rep > 1) gpu[rep % 2].push_back(ms), wall[rep % 2].push_back(w);
  }
  for (int k = 0; k < 2; ++k) {
    std::sort(gpu[k].begin(), gpu[k].end());
    std::sort(wall[k].begin(), wall[k].end());
    std::printf("[ the selection's launches over 16 x 4096 x 2048 values, %s: %.3f ms in the stream, %.3f ms with the "
                "wait ]\n", k ? "later passes over the copies" : "every pass over the whole values",
                gpu[k][gpu[k].size() / 2], wall[k][wall[k].size() / 2]);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}
#endif

// Session-level statistics with the logits go layer by layer: the progress rises to 1 after every layer's passes,
// a cancel stops them between layers with ds::Cancelled, and the session gives the same statistics afterwards (the
// demo model on the CPU backend, one layer a step), and again in steps of several layers; the exact medians' third
// pass (DS_OUTLIER_EXACT_MEDIANS=1) changes the logits' medians by at most 2^-17 (relatively) and nothing else.
TEST(OutlierStats, CancelStopsBetweenLayersAndTheSessionStaysAsItWas) {
  auto s =
      ds::Session::open(dstest::source_dir() + "/assets/models/diffllama-demo", ds::BackendChoice::Cpu, nullptr, 2);
  std::vector<int32_t> ids(150);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(10 + (i * 37) % 3000);
  s->set_ids(ids);
  s->run();
  const int L = int(s->config().layers);
  ds::OutlierRequest q;
  q.min_step_ms = 0;  // one layer a step
  std::vector<double> seen;
  q.progress = [&](double f) { seen.push_back(f); };
  const std::string whole = ds::outliers_json(ds::outlier_stats(*s, q));
  ASSERT_GE(seen.size(), size_t(ds::RankFinder::kPasses * L));
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  EXPECT_GT(seen.front(), 0.0);
  EXPECT_EQ(seen.back(), 1.0);
  int polls = 0;
  ds::OutlierRequest c;
  c.min_step_ms = 0;
  c.cancel = [&] { return ++polls > L + 1; };  // stops in the second pass
  EXPECT_THROW(ds::outlier_stats(*s, c), ds::Cancelled);
  EXPECT_EQ(polls, L + 2);
  // Steps of several layers where the layers are quick (the default request): the same statistics, the progress
  // still rising to 1.
  ds::OutlierRequest g;
  std::vector<double> seen2;
  g.progress = [&](double f) { seen2.push_back(f); };
  EXPECT_EQ(ds::outliers_json(ds::outlier_stats(*s, g)), whole);
  EXPECT_TRUE(std::is_sorted(seen2.begin(), seen2.end()));
  EXPECT_EQ(seen2.back(), 1.0);
  // DS_OUTLIER_EXACT_MEDIANS=1 (a third pass): the same top values, every logit median within 2^-17 of the exact one
  ::setenv("DS_OUTLIER_EXACT_MEDIANS", "1", 1);
  const ds::Outliers exact = ds::outlier_stats(*s);
  ::unsetenv("DS_OUTLIER_EXACT_MEDIANS");
  const ds::Outliers two = ds::outlier_stats(*s);
  ASSERT_EQ(exact.layers.size(), two.layers.size());
  auto near = [](const ds::OutlierSet& a, const ds::OutlierSet& b, const std::string& what) {
    EXPECT_EQ(a.top100, b.top100) << what;
    EXPECT_LE(std::fabs(double(a.s.median) - double(b.s.median)), 0x1p-17 * double(b.s.median)) << what;
  };
  for (size_t l = 0; l < two.layers.size(); ++l) {
    near(two.layers[l].logit1, exact.layers[l].logit1, "layer " + std::to_string(l) + " map 1");
    near(two.layers[l].logit2, exact.layers[l].logit2, "layer " + std::to_string(l) + " map 2");
    EXPECT_EQ(two.layers[l].hidden.s.median, exact.layers[l].hidden.s.median);
  }
  near(two.logit1, exact.logit1, "model map 1");
  near(two.logit2, exact.logit2, "model map 2");
}

