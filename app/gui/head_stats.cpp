// Thumbnails and the difference map, from the post-softmax maps the backend returns.
#include "head_stats.h"

#include <algorithm>
#include <cmath>

namespace ds::gui {

void downsample(const float* m, int64_t n, int size, std::vector<float>& out) {
  out.assign(size_t(size) * size, 0.0f);
  if (n == 0 || size == 0)
    return;
  std::vector<float> count(out.size(), 0.0f);
  for (int64_t q = 0; q < n; ++q) {
    const int64_t ty = q * size / n;
    for (int64_t k = 0; k < n; ++k) {
      const int64_t tx = k * size / n;
      out[ty * size + tx] += m[q * n + k];
      count[ty * size + tx] += 1;
    }
  }
  for (size_t i = 0; i < out.size(); ++i)
    out[i] /= std::max(count[i], 1.0f);
}

std::vector<Thumb> layer_thumbs(const LayerMaps& maps, double lambda, int thumb_size) {
  std::vector<Thumb> out;
  const int64_t n = maps.n, nn = n * n;
  const int size = thumb_size > 0 ? int(std::min<int64_t>(thumb_size, n)) : int(std::min<int64_t>(n, 32));
  const bool diff = !maps.a2.empty();
  std::vector<float> d(diff ? nn : 0);
  for (int64_t h = 0; h < maps.heads; ++h) {
    const float* a1 = maps.a1.data() + h * nn;
    const float* a2 = diff ? maps.a2.data() + h * nn : nullptr;
    Thumb t;
    t.size = size;
    downsample(a1, n, size, t.a1);
    if (diff) {
      downsample(a2, n, size, t.a2);
      for (int64_t i = 0; i < nn; ++i)
        d[i] = float(a1[i] - lambda * a2[i]);
      downsample(d.data(), n, size, t.diff);
    } else {
      t.diff = t.a1;
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace ds::gui
