// See outlier_select.h.
#include "engine/core/outlier_select.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/core/error.h"

namespace ds {

namespace {
constexpr int kShift[RankFinder::kPasses] = {20, 8, 0};
constexpr int kWidth[RankFinder::kPasses] = {12, 12, 8};
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

RankFinder::RankFinder(std::vector<uint64_t> ranks) : rank_(std::move(ranks)), prefix_(rank_.size(), 0) {}

RadixPass RankFinder::pass() const {
  RadixPass p;
  p.shift = kShift[pass_], p.width = kWidth[pass_];
  if (pass_ > 0)
    for (uint32_t x : prefix_)
      if (std::find(p.prefixes.begin(), p.prefixes.end(), x) == p.prefixes.end()) p.prefixes.push_back(x);
  return p;
}

void RankFinder::take(const std::vector<uint64_t>& counts) {
  const RadixPass p = pass();
  const size_t bins = size_t(p.bins());
  if (counts.size() != size_t(p.histograms()) * bins) throw Error("internal: outlier pass counts of the wrong size");
  for (size_t i = 0; i < rank_.size(); ++i) {
    const size_t h = p.prefixes.empty() ? 0 : size_t(std::find(p.prefixes.begin(), p.prefixes.end(), prefix_[i]) -
                                                       p.prefixes.begin());
    const uint64_t* c = counts.data() + h * bins;
    uint64_t below = 0;
    size_t d = 0;
    while (d + 1 < bins && below + c[d] <= rank_[i]) below += c[d++];
    if (below + c[d] <= rank_[i]) throw Error("internal: an outlier rank beyond the values counted");
    rank_[i] -= below;
    prefix_[i] = (prefix_[i] << p.width) | uint32_t(d);
  }
  ++pass_;
}

float RankFinder::value(size_t i) const {
  if (!done()) throw Error("internal: RankFinder::value before its last pass");
  float v;
  const uint32_t b = prefix_.at(i);
  std::memcpy(&v, &b, 4);
  return v;
}

std::vector<uint64_t> top_median_ranks(uint64_t count) {
  return {count > 100 ? count - 100 : 0, (count - 1) / 2, count / 2};
}

}  // namespace ds
