// The outlier statistics' radix select (engine/core/outlier_select.h) against std::nth_element on fresh random values
// (heavy tails, ties, zeros, negative values): exact equality of every rank, and of the summary's top and median; and
// the CUDA passes (kernels/outlier_count.cu) against the host passes on the same values, where a GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/core/outlier_select.h"

#ifdef DS_HAVE_CUDA
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
