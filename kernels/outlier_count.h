// The outlier statistics' passes over |x| on the device (engine/core/outlier_select.h has the algorithm): counts of
// a radix pass's digits, and the values at or above a threshold, over a dense array or over chunks of attention logit
// rows (the map kernels' layout [groups][rows][n], group g's map g % nmaps, only the causal cells of query row0 + r
// inside the window counted).
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace ds::kern {

struct OutlierCells {
  const float* x = nullptr;
  int64_t groups = 1, rows = 1, n = 0;  // dense: groups 1, rows 1, n the count
  int nmaps = 1;
  bool causal = false;  // logit rows: key k of row r counts when window_first_key(window, row0 + r) <= k <= row0 + r
  int row0 = 0, window = 0;
};

// What a counting pass also collects (optional): the values with |x| >= at_least[map] (device [nmaps] f32) go to
// out + map * cap (|x|; the first `cap` found), found[map] (device u32, added to) counting all of them.
struct OutlierCollect {
  const float* at_least = nullptr;  // null: nothing collected
  float* out = nullptr;
  int cap = 0;
  unsigned* found = nullptr;
};

// counts: [nmaps][max(1, nprefix)][1 << width] u64 (added to); prefixes: device [nprefix] (nprefix 0: every value).
cudaError_t launch_outlier_count(const OutlierCells& c, int shift, int width, const uint32_t* prefixes, int nprefix,
                                 unsigned long long* counts, cudaStream_t stream, const OutlierCollect& collect = {});

// One pass over several dense arrays in one launch (a pass over the hidden states of every layer). Source s counts
// the digits of its values whose bits above the digit equal one of prefixes[prefix_at .. prefix_at + nprefix)
// (nprefix 0: every value, one histogram) into counts + counts_at ([max(1, nprefix)][1 << width] u32, added to: a
// source holds fewer than 2^32 values), and
// where collect_at >= 0 collects the values with |x| >= at_least (f32) into out + collect_at (|x|; the first cap),
// found[s] (u32, added to) counting them all. width 0: nothing counted (a collection alone).
struct DenseSource {
  const float* x = nullptr;
  int64_t count = 0;
  int prefix_at = 0, nprefix = 0;
  int64_t counts_at = 0;
  float at_least = 0;
  int64_t collect_at = -1;
  int cap = 0;
};
// sources: device [nsources]; max_count and max_nprefix: the largest of the sources' (the grid and the shared
// histograms are sized by them).
cudaError_t launch_outlier_count_dense(const DenseSource* sources, int nsources, int64_t max_count, int max_nprefix,
                                       int shift, int width, const uint32_t* prefixes, unsigned* counts,
                                       float* out, unsigned* found, cudaStream_t stream);
// Values with |x| >= at_least[map] (device [nmaps] f32) into out + map * cap (|x|; the first `cap` found), found[map]
// (device u32, added to) counting all of them.
cudaError_t launch_outlier_collect(const OutlierCells& c, const float* at_least, float* out, int cap, unsigned* found,
                                   cudaStream_t stream);

}  // namespace ds::kern
