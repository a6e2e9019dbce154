// Overview thumbnails, cut from LayerMaps. The statistics are the engine's (Backend::head_stats).
#pragma once
#include <cstdint>

#include "engine/backend.h"
#include "snapshot.h"

namespace ds::gui {

// Box-average an [n, n] map into [size, size] (size <= n).
void downsample(const float* m, int64_t n, int size, std::vector<float>& out);

// Thumbnails of every head of one layer; thumb_size 0 picks min(n, 32).
std::vector<Thumb> layer_thumbs(const LayerMaps& maps, double lambda, int thumb_size = 0);

}  // namespace ds::gui
