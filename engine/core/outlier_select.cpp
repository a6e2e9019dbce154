// See outlier_select.h.
#include "engine/core/outlier_select.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "engine/core/error.h"

namespace ds {

namespace {
constexpr const int* kShift = kRadixShift;
constexpr const int* kWidth = kRadixWidth;
static_assert(RankFinder::kPasses == 3);
}  // namespace

uint32_t abs_bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b & 0x7fffffffu;
}

void radix_count(const float* x, int64_t count, const RadixPass& pass, uint64_t* counts) {
  const uint32_t mask = (1u << pass.width) - 1, hi = uint32_t(pass.shift + pass.width);
  const int P = int(pass.prefixes.size());
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t b = abs_bits(x[i]), digit = (b >> pass.shift) & mask;
    if (P == 0) {
      ++counts[digit];
      continue;
    }
    const uint32_t top = hi >= 32 ? 0 : b >> hi;
    for (int p = 0; p < P; ++p)
      if (top == pass.prefixes[size_t(p)]) counts[size_t(p) * (mask + 1) + digit] += 1;
  }
}

RankFinder::RankFinder(std::vector<uint64_t> ranks, int passes)
    : rank0_(ranks), rank_(std::move(ranks)), prefix_(rank_.size(), 0), retired_(rank_.size(), false), passes_(passes) {
  if (passes < 2 || passes > kPasses) throw Error("internal: RankFinder of " + std::to_string(passes) + " passes");
}

void RankFinder::retire(size_t i) { retired_.at(i) = true; }

RadixPass RankFinder::pass() const {
  RadixPass p;
  p.shift = kShift[pass_], p.width = kWidth[pass_];
  if (pass_ > 0)
    for (size_t i = 0; i < prefix_.size(); ++i)
      if (!retired_[i] && std::find(p.prefixes.begin(), p.prefixes.end(), prefix_[i]) == p.prefixes.end())
        p.prefixes.push_back(prefix_[i]);
  return p;
}

void RankFinder::take(const std::vector<uint64_t>& counts) {
  const RadixPass p = pass();
  if (counts.size() != size_t(p.histograms()) * size_t(p.bins())) throw Error("internal: outlier pass counts of the wrong size");
  take(counts.data(), p.prefixes);
}

void RankFinder::take(const uint64_t* counts, const std::vector<uint32_t>& have) {
  if (done()) throw Error("internal: RankFinder::take after its last pass");
  const int width = kWidth[pass_];
  const size_t bins = size_t(1) << width;
  for (size_t i = 0; i < rank_.size(); ++i) {
    if (retired_[i]) continue;
    size_t h = 0;
    if (pass_ > 0) {
      h = size_t(std::find(have.begin(), have.end(), prefix_[i]) - have.begin());
      if (h == have.size()) throw Error("internal: an outlier pass without a prefix it needs");
    }
    const uint64_t* c = counts + h * bins;
    uint64_t below = 0;
    size_t d = 0;
    while (d + 1 < bins && below + c[d] <= rank_[i]) below += c[d++];
    if (below + c[d] <= rank_[i]) throw Error("internal: an outlier rank beyond the values counted");
    rank_[i] -= below;
    prefix_[i] = (prefix_[i] << width) | uint32_t(d);
  }
  ++pass_;
}

uint64_t RankFinder::below(size_t i) const { return rank0_.at(i) - rank_.at(i); }

float RankFinder::floor_value(size_t i) const {
  if (pass_ == 0) return 0.f;
  const uint32_t b = prefix_.at(i) << kShift[pass_ - 1];
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}

float RankFinder::value(size_t i) const {
  if (!done() || retired_.at(i)) throw Error("internal: RankFinder::value before its last pass or of a retired rank");
  const int sh = kShift[passes_ - 1];
  uint32_t b = prefix_.at(i) << sh;
  if (sh > 0 && b > 0 && b < 0x7f800000u) b |= 1u << (sh - 1);  // the middle (one binade: values linear in bits)
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}

std::vector<uint64_t> top_median_ranks(uint64_t count) {
  return {count > 100 ? count - 100 : 0, (count - 1) / 2, count / 2};
}

}  // namespace ds
