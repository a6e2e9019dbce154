// Post-softmax attention maps of one layer, recomputed on demand from the cached (post-RoPE) Q/K, with per-row
// statistics. Two launches per chunk of query rows: scaled logits, then softmax in place + statistics.
#pragma once
#include "attn_params.h"

namespace ds::kern {

// Per query row statistics written by launch_attn_map_softmax, [view head][row][MAP_NSTAT]. D = A1 - lambda*A2
// (D = A1 for plain attention); entropies in nats; max logits are q.k/sqrt(d) before the softmax.
enum MapStat {
  MAP_ENTROPY1, MAP_ENTROPY2, MAP_ENTROPY_DIFF, MAP_FIRST1, MAP_FIRST2, MAP_FIRST_DIFF, MAP_NEG_MASS,
  MAP_DIFF_MIN, MAP_DIFF_MAX, MAP_MAX_LOGIT1, MAP_MAX_LOGIT2, MAP_NSTAT
};

// maps: [nheads][nmaps][rows][n] f32 for query rows [row0, row0 + rows) of batch 0 and view heads head0 ..
// head0 + nheads - 1 (all by default; nmaps = 2 if p.diff). Writes q.k * p.scale for the row's keys (<= row, and
// within p.window; K from p.kv when set); entries right of the diagonal and left of the window are left for the
// softmax pass.
cudaError_t launch_attn_map_logits(const AttnParams& p, int row0, int rows, float* maps, cudaStream_t stream,
                                   int head0 = 0, int nheads = -1);
// In place: logits -> probabilities (0 right of the diagonal and left of the window), and the row statistics
// [nheads][rows][MAP_NSTAT] (lambda from p.lambda; over the row's keys only) of the nheads heads the logits pass
// computed. MAP_MAX_LOGIT* hold the largest |logit|.
cudaError_t launch_attn_map_softmax(const AttnParams& p, int row0, int rows, float* maps, float* row_stats,
                                    cudaStream_t stream, int nheads = -1);

// Per view head, the rows' statistics reduced on the device: out [heads][MAP_NSTAT] f64 holds the sums over the n
// rows of the summed terms (entropies, first-token values, negative mass), the min of MAP_DIFF_MIN and the max of
// MAP_DIFF_MAX and of the max-logit terms. row_stats: [heads][n][MAP_NSTAT].
cudaError_t launch_attn_stats_reduce(const float* row_stats, int heads, int n, double* out, cudaStream_t stream);

// Per view head, one query row q (maps: [heads][nmaps][n], after the softmax pass with rows = 1) split over its keys
// 0..q into the span [a0, a1), key 0 outside it and the rest, for A1, A2, D = A1 - lambda A2 and |D| (engine/
// map_query.h's RowMass): out [heads][3 parts][4 maps] f64, parts in the order answer, sink, context.
cudaError_t launch_attn_row_mass(const float* maps, int heads, int nmaps, int n, int q, float lambda, int a0, int a1,
                                 double* out, cudaStream_t stream);

// A pooled view's rectangle and grid (engine/core/map_query.h has the rules): query rows [q0, q1), keys [k0, k1),
// rows x cols blocks, max or mean, D = A1 - lambda A2.
struct ViewPoolArgs {
  int64_t q0, q1, k0, k1;
  int rows, cols;
  bool mean;
  float lambda;
};
// The grids a1, a2, diff [rows x cols] are accumulators while a view is pooled: zeroed first, then every pooling
// launch folds into them (launch_attn_map_pool here, launch_attn_map_view in diff_attn_fwd.h): sums for mean
// pooling, maxima for max pooling, the signed map's maxima as warp_reduce.cuh's max_abs_key. launch_attn_view_finish
// turns them into the view's values (means, decoded maxima). a2 may be null for nmaps = 1.
//
// Folds one head's probability rows [row0, row0 + rows) (maps: [nmaps][rows][n], after the softmax pass).
cudaError_t launch_attn_map_pool(const float* maps, int nmaps, int rows, int n, int row0, const ViewPoolArgs& v,
                                 float* a1, float* a2, float* diff, cudaStream_t stream);
cudaError_t launch_attn_view_finish(const ViewPoolArgs& v, float* a1, float* a2, float* diff, cudaStream_t stream);

}  // namespace ds::kern
