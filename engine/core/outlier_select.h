// Order statistics of |x| over value sets too large to hold (every causal attention logit of a layer) or to bring to
// the host (a long prompt's hidden states): a radix select over the bits of |x| (a non-negative float's bits order
// as unsigned integers) in three passes over the values -- 12, 12 and 7 bits, exact; or the first two, within 2^-17
// relatively (RankFinder) -- each pass counting, per wanted
// rank, the values whose higher bits match what the earlier passes fixed. The values are produced again for each
// pass (the backends recompute logits chunk by chunk), so memory stays O(chunk). Written by hand: the selection
// libraries at hand (CUB's radix sort, std::nth_element) need every value in memory at once.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ds {

// One pass: digit = (bits >> shift) & ((1 << width) - 1), counted for values whose bits >> (shift + width) equal
// prefixes[p] (one histogram per prefix), or for every value when `prefixes` is empty (one histogram).
struct RadixPass {
  int shift = 20, width = 12;
  std::vector<uint32_t> prefixes;
  int histograms() const { return prefixes.empty() ? 1 : int(prefixes.size()); }
  int bins() const { return 1 << width; }
};

// Adds the pass's counts of |x[0..count)| to counts [histograms][bins].
void radix_count(const float* x, int64_t count, const RadixPass& pass, uint64_t* counts);
// The bits of |x| the passes read (sign cleared).
uint32_t abs_bits(float x);

// The passes' digits: the 31 bits of |x| (the sign bit is 0) as 12 + 12 + 7.
inline constexpr int kRadixShift[3] = {19, 7, 0};
inline constexpr int kRadixWidth[3] = {12, 12, 7};

// The values at ascending ranks (0: the smallest) of one multiset, found over RankFinder::kPasses passes, or over
// the first two alone: then each rank's value is known to its 24 leading bits (an interval of 2^7 f32 steps, a
// relative width of at most 2^-16) and value() gives the interval's middle, within 2^-17 of the value relatively.
class RankFinder {
 public:
  static constexpr int kPasses = 3;
  explicit RankFinder(std::vector<uint64_t> ranks, int passes = kPasses);
  // This pass's query: the distinct prefixes of the ranks still to place (pass 0: none, one histogram).
  RadixPass pass() const;
  // Takes the pass's counts [pass().histograms()][bins] and moves to the next pass.
  void take(const std::vector<uint64_t>& counts);
  // The same from a pass over more prefixes than this finder's: counts [max(1, have.size())][bins] for the
  // prefixes `have` (a superset of pass().prefixes, in any order; empty on the first pass), read in place.
  void take(const uint64_t* counts, const std::vector<uint32_t>& have);
  // Rank i is no longer wanted (its value came another way): its prefix leaves the later passes; value(i) throws.
  void retire(size_t i);
  bool done() const { return pass_ == passes_; }
  // Rank i's value, once done(): exact after kPasses passes, else the middle of its prefix's interval (0 for the
  // interval at 0, the interval's floor at inf and NaN).
  float value(size_t i) const;
  size_t size() const { return rank_.size(); }
  // After a pass: how many values lie below rank i's prefix (its bits fixed so far), and the smallest value with
  // that prefix (0 before the first pass). So exactly count - below(i) values are >= floor_value(i), rank i's among them.
  uint64_t below(size_t i) const;
  float floor_value(size_t i) const;

 private:
  std::vector<uint64_t> rank0_;   // the ranks asked for
  std::vector<uint64_t> rank_;    // the ranks, then the rank left within the current prefix
  std::vector<uint32_t> prefix_;  // the bits fixed so far
  std::vector<bool> retired_;
  int pass_ = 0, passes_ = kPasses;
};

// The summary of one value set the outlier statistics report (paper Table 5): the 1st, 2nd, 3rd, 10th and 100th
// largest |x| (NaN where the set has fewer values) and the median (the mean of the two middle values of an even set,
// as numpy's), over `count` values.
struct TopMedian {
  float top[5] = {0, 0, 0, 0, 0};
  float median = 0;
  uint64_t count = 0;
};
// The ascending ranks a TopMedian needs of a set of `count` values: [count - 100 (or 0), lower middle, upper middle].
std::vector<uint64_t> top_median_ranks(uint64_t count);

}  // namespace ds
