// The statistic every benchmark reports: the median of its timed runs (the upper middle for an even count; 0 for
// none).
#pragma once
#include <algorithm>
#include <vector>

namespace ds {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace ds
