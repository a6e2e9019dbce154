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
  }
}
#endif
