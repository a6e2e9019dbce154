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
  int64_t whole = 0;  // the selection's: the values its ranks count over (0: count; count may be a compacted subset's)
};
// sources: device [nsources]; max_count: the largest of the sources' (the grid is sized by it); max_nprefix: the
// histograms a source keeps in shared memory (a source with more prefixes counts the others in global memory).
// width 0 with collect_at < 0: that source's blocks return at once.
cudaError_t launch_outlier_count_dense(const DenseSource* sources, int nsources, int64_t max_count, int max_nprefix,
                                       int shift, int width, const uint32_t* prefixes, unsigned* counts,
                                       float* out, unsigned* found, cudaStream_t stream);
// Values with |x| >= at_least[map] (device [nmaps] f32) into out + map * cap (|x|; the first `cap` found), found[map]
// (device u32, added to) counting all of them.
cudaError_t launch_outlier_collect(const OutlierCells& c, const float* at_least, float* out, int cap, unsigned* found,
                                   cudaStream_t stream);

// The selection itself on the device, over the dense sources' passes (outlier_select.h's RankFinder for every layer's
// hidden states at once, without a host round trip between passes): three ranks per source (its 100th largest, which
// "folds" into a collection of every value at or above its prefix's floor as soon as at most `cap` values lie there,
// and its two middles) and two over every source's values (the model's middles). A pass is: the counting launch
// (launch_outlier_count_dense with the table, prefixes and counts below), then launch_outlier_select, which places
// every rank a digit further and writes the next pass's table (prefix lists, collections). After the last pass, one
// counting launch of width 0 collects for the sources whose top rank was placed only then.
struct RankState {
  unsigned long long rank0 = 0;  // the ascending rank asked for (0: the smallest)
  unsigned long long rank = 0;   // what is left of it within its prefix
  uint32_t prefix = 0;           // the bits fixed so far
  float floor = 0;               // the smallest value with that prefix
  int state = 0;                 // 0: being placed; 1: folded at this pass (its source collects next); 2: retired
};
constexpr int kSelectPrefixes = 8;  // prefix slots per source (at most 5 are used: 3 own ranks, 2 of the model's)
struct SelectPlan {
  int nsources = 0;               // at most kMaxSelectSources
  DenseSource* table = nullptr;   // [nsources] (count fixed; the rest written by launch_outlier_select)
  uint32_t* prefixes = nullptr;   // [nsources][kSelectPrefixes]
  unsigned* counts = nullptr;     // [nsources][kSelectPrefixes][4096] (table[s].counts_at = s * kSelectPrefixes * 4096)
  RankState* ranks = nullptr;     // [3 nsources + 2]: source s's at 3s (its top rank, then its middles); the model's
  int cap = 0;                    // values a source collects
  int* error = nullptr;           // set to 1 when a rank lies beyond the values counted or a prefix list overflows
  // Optional (null: every pass reads the whole sources): after the first pass, one pass copies each source's values
  // whose first digit's prefix is one of its ranks' (and, while its top rank is unplaced, every value above that
  // prefix) to compact + s * compact_cap, compact_n[s] counting them (u32 [nsources], zeroed by the launch); the
  // later passes read the copy, or the whole source where more than compact_cap values were found.
  float* compact = nullptr;
  int64_t compact_cap = 0;
  unsigned* compact_n = nullptr;
};
constexpr int kMaxSelectSources = 1024;
// After a counting pass (digits of `width` bits at `shift`; `first`: the pass without prefixes, `last`: the final one):
// every rank still being placed takes its digit; a source's top rank folds when at most cap values lie at or above its new floor (or at the last pass, last true);
// then the next pass's table: the sources that collected in this pass stop, those folded now collect, every source's
// prefix list is its ranks' and the model's. The counts are read, not cleared.
cudaError_t launch_outlier_select(const SelectPlan& plan, int shift, int width, bool first, bool last,
                                  cudaStream_t stream);
// The whole selection queued: for each of `passes` passes (digits width[p] at shift[p]) the counts cleared, the
// counting launch over plan.table (histograms of the sources' prefixes; the folded sources' collections into
// out + s * cap, found[s] counting them) and the selection step, with plan.compact the compaction after the first;
// then the collection of the sources whose top rank was placed at the last pass. plan.table, plan.ranks, found and
// *plan.error must be initialised (the table's nprefix 0, collect_at -1; found and error 0). max_count: the largest
// source's count.
cudaError_t launch_outlier_select_passes(const SelectPlan& plan, int passes, const int* shift, const int* width,
                                         int64_t max_count, float* out, unsigned* found, cudaStream_t stream);
// Each source's collected values (out + s * cap, found[s] of them; plan.cap <= 1024) sorted largest first on the
// device, the first min(found[s], k) to top + s * k; a source that found more than cap is left (the caller collects
// again).
cudaError_t launch_outlier_sort_top(const SelectPlan& plan, const float* out, const unsigned* found, float* top, int k,
                                    cudaStream_t stream);

}  // namespace ds::kern
