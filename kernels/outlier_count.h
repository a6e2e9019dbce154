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

// counts: [nmaps][max(1, nprefix)][1 << width] u64 (added to); prefixes: device [nprefix] (nprefix 0: every value).
cudaError_t launch_outlier_count(const OutlierCells& c, int shift, int width, const uint32_t* prefixes, int nprefix,
                                 unsigned long long* counts, cudaStream_t stream);
// Values with |x| >= at_least[map] (device [nmaps] f32) into out + map * cap (|x|; the first `cap` found), found[map]
// (device u32, added to) counting all of them.
cudaError_t launch_outlier_collect(const OutlierCells& c, const float* at_least, float* out, int cap, unsigned* found,
                                   cudaStream_t stream);

}  // namespace ds::kern
