// Queries on the attention maps of the last forward that never put an n x n map on the host: a pooled view of a
// rectangle of one head's A1, A2 and D = A1 - lambda*A2, exact rows of chosen query positions, and per-head
// statistics. Every backend answers them (Backend::map_view / map_rows / head_stats) with the definitions here.
//
// Maps: A1 (and A2 for differential heads) are the post-softmax causal rows, A[q, k] = 0 for k > q. D = A1 - lambda
// * A2 with the layer's lambda of the last forward; for plain (Llama) heads D = A1 and there is no A2.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "kernels/attn_heads.h"

namespace ds {

struct ModelConfig;

// ---------------------------------------------------------------------------------------------------------------
// views

enum class Pool { Max, Mean };

// A rectangle of query rows [q0, q1) x key columns [k0, k1) of layer `layer`, head `head`, pooled to a rows x cols
// grid. Block i of the grid covers rows q0 + floor(i * R_ext / R) .. q0 + floor((i + 1) * R_ext / R) - 1 (R_ext =
// q1 - q0), likewise for columns; R and C are capped at the rectangle's extent, so a small rectangle comes back at
// full resolution. Max: the largest A1 / A2 of the block and, for D, the entry of largest magnitude with its sign;
// mean: the block's sum over its cell count. Masked cells (k > q) count as 0 in both.
struct ViewRequest {
  int layer = 0, head = 0;
  int64_t q0 = 0, q1 = -1, k0 = 0, k1 = -1;  // -1: up to n
  int rows = 512, cols = 512;
  Pool pool = Pool::Max;
  // The lambda of D = A1 - lambda A2; empty: the layer's lambda in the last forward. A layer's maps do not depend on
  // its own lambda, so a view under a new value needs no new forward (the GUI shows it before the run).
  std::optional<float> lambda;
  // Non-null: the grids go to this memory on the backend's CUDA device instead of MapView's vectors (which stay
  // empty): [3, rows, cols] = a1, a2, diff with rows and cols after capping (prepare_view says them). The CUDA
  // backend only; the call returns when the memory holds the grids. (The Python module's device arrays.)
  float* device_out = nullptr;
};

struct MapView {
  int layer = 0, head = 0;
  int64_t q0 = 0, q1 = 0, k0 = 0, k1 = 0;  // the rectangle after clamping
  int rows = 0, cols = 0;                  // the grid after capping
  Pool pool = Pool::Max;
  float lambda = 0;                        // the lambda D was formed with (0 for plain heads)
  bool differential = false;
  std::vector<float> a1, a2, diff;         // [rows, cols]; a2 empty for plain heads, diff = a1 there
};

// Checks `req` against a layer count, a view-head count and n, and fills the clamped rectangle and capped grid of
// `out` (its vectors sized, and zeroed unless `zero` is false). Throws ds::Error with a one-line reason.
void prepare_view(const ViewRequest& req, int layers, int heads, int64_t n, bool differential, float lambda,
                  MapView& out, bool zero = true);

// Block arithmetic of the grid, shared with the device code.
using kern::view_block;
using kern::view_block_start;

// Folds full rows of one head into a view (the CPU backend's way; the CUDA backend pools on the device with the
// same rules). a1/a2: row q's n values (a2 nullptr for plain heads).
void view_add_row(MapView& v, int64_t q, const float* a1, const float* a2);
// After every row: mean pooling divides by the cell counts.
void view_finish(MapView& v);

// ---------------------------------------------------------------------------------------------------------------
// implicit attention of a Mamba layer (Backend::mamba_view)
//
// A Mamba-1 scan unrolled from a zero state ("The Hidden Attention of Mamba Models", Ali, Zimerman and Wolf 2024,
// arXiv 2403.01590) is, per channel c, a causal linear operator on the channel's input u:
//   y[q, c] = sum_{k <= q} M_c[q, k] u[k, c] + D_c u[q, c],
//   M_c[q, k] = delta[k, c] sum_s C[q, s] exp(A[c, s] (cum_c[q] - cum_c[k])) B[k, s],   cum_c[q] = sum_{t <= q} delta[t, c]
// (delta = softplus(dt + dt_bias), the scan's step; exp(A (cum[q] - cum[k])) = the product of the decays of steps
// k + 1 .. q). M_c is signed and unnormalised. A view of it (req.head = the channel) pools like D: max keeps the
// entry of largest magnitude with its sign, mean the block's sum over its cell count; masked cells (k > q) are 0.
// The MapView has differential = false and a1 = diff = the pooled M_c (a2 empty).

// One channel's inputs (double where the prefix sums lose digits in float at long prompts).
struct MambaChannel {
  int S = 0;
  std::vector<double> delta, cum;  // [n]
  std::vector<double> A;           // [S]
  const float* B = nullptr;        // row k's S values at B + k * ld
  const float* C = nullptr;
  int64_t ld = 0;
};
// Row q of M_c over keys [k0, min(k1, q + 1)) into row[k] (other entries untouched).
void mamba_implicit_row(const MambaChannel& ch, int64_t q, int64_t k0, int64_t k1, float* row);
// Checks that `layer` has a selective scan (Mamba or memory kind) and that req.head is one of its d_inner channels,
// then prepares `out` as prepare_view does. Throws ds::Error with a one-line reason.
void prepare_mamba_view(const ViewRequest& req, const ModelConfig& cfg, int64_t n, MapView& out, bool zero = true);
// The checks of Backend::mamba_row (the layer has a scan, the channel exists, 0 <= q < n), as one-line ds::Errors.
void check_mamba_row(int layer, int channel, int64_t q, const ModelConfig& cfg, int64_t n);

// ---------------------------------------------------------------------------------------------------------------
// rows

// The exact rows of chosen query positions for every head of a layer.
struct MapRows {
  int layer = 0;
  int64_t heads = 0, n = 0;
  std::vector<int64_t> positions;  // [P], each in [0, n)
  std::vector<float> a1, a2;       // [heads, P, n]; a2 empty for plain heads
  // Set by the caller before the query: write the rows [heads, P, n] here instead of into a1 / a2 (which then stay
  // empty): host memory (out1, out2), or memory on the backend's CUDA device (device_out1, device_out2; the CUDA
  // backend only, and the call returns when the memory holds the rows). out2 / device_out2 only for differential
  // heads. The Python module stacks several layers' rows in one array this way.
  float* out1 = nullptr;
  float* out2 = nullptr;
  float* device_out1 = nullptr;
  float* device_out2 = nullptr;
  bool on_device() const { return device_out1 != nullptr; }
  float* rows1() { return device_out1 ? device_out1 : out1 ? out1 : a1.data(); }
  float* rows2() { return device_out1 ? device_out2 : out1 ? out2 : a2.data(); }
};
// Positions as the CLI takes them (negative counts from the end: -1 is the last token), checked against n.
std::vector<int64_t> resolve_positions(const std::vector<int64_t>& positions, int64_t n);
// Fills out's shape and resolved positions and sizes its rows (zeroed; caller memory on the host is zeroed, device
// memory is left for the backend to fill); throws ds::Error for a bad position.
void prepare_rows(int layer, int64_t heads, int64_t n, bool differential, const std::vector<int64_t>& positions,
                  MapRows& out);

// ---------------------------------------------------------------------------------------------------------------
// row mass (corpus scans, engine/session/session_scan.h)

// One query row q of one head split three ways over its causal keys 0..q: the span [a0, a1) ("answer"), key 0
// ("sink"; 0 when the span holds it) and every other key ("context"); for A1, A2, D = A1 - lambda*A2 and |D|.
// Plain heads: the A2 entries are 0 and D = A1.
enum MassMap { MASS_A1, MASS_A2, MASS_D, MASS_ABS_D, MASS_NMAPS };
struct RowMass {
  double answer[MASS_NMAPS] = {}, sink[MASS_NMAPS] = {}, context[MASS_NMAPS] = {};
};
// From a row's probabilities (a2 nullptr for plain heads); the CUDA backend reduces on the device with the same rule.
RowMass row_mass_of(const float* a1, const float* a2, int64_t q, float lambda, int64_t a0, int64_t a1_end);
// Throws ds::Error unless 0 <= q < n and 0 <= a0 < a1 <= q + 1 (the span must lie in the row's causal keys).
void check_row_mass(int64_t q, int64_t n, int64_t a0, int64_t a1);

// ---------------------------------------------------------------------------------------------------------------
// statistics

// Per head, means over the n query rows q (row q has the q + 1 causal keys 0..q) unless said otherwise:
//   entropy1/2    -sum_k A[q,k] log A[q,k], nats
//   entropy_diff  entropy of |D[q,:]| / sum_k |D[q,k]| (0 for a row whose D is all zero)
//   first1/2      A[q, 0], the mass on the first token; first_diff = D[q, 0]
//   neg_mass      sum_k max(0, -D[q,k]), the mass the difference removes below zero
//   diff_min/max  extremes of D over all causal cells (not means)
//   max_logit1/2  the largest |q.k| / sqrt(d) before the softmax over all causal cells (the "max attention logit"
//                 of https://github.com/microsoft/unilm/issues/1666, in magnitude; not a mean)
// For plain heads the map-2 fields are NaN (there is no A2) and D = A1.
struct HeadStats {
  float entropy1 = 0, entropy2 = 0, entropy_diff = 0;
  float first1 = 0, first2 = 0, first_diff = 0;
  float neg_mass = 0;
  float diff_min = 0, diff_max = 0;
  float max_logit1 = 0, max_logit2 = 0;
};

// The per-row terms of the statistics, summed over rows, and their reduction: one definition for every backend.
struct StatsAccumulator {
  double entropy1 = 0, entropy2 = 0, entropy_diff = 0, first1 = 0, first2 = 0, first_diff = 0, neg_mass = 0;
  float diff_min = std::numeric_limits<float>::infinity(), diff_max = -std::numeric_limits<float>::infinity();
  float max_logit1 = -std::numeric_limits<float>::infinity(), max_logit2 = -std::numeric_limits<float>::infinity();
  int64_t rows = 0;
  // Row q of one head from its probabilities (a2 nullptr for plain heads) and the rows' largest |logit|.
  void add_row(int64_t q, const float* a1, const float* a2, float lambda, float max_logit1, float max_logit2);
  // The same from a row's terms computed elsewhere (the CUDA backend's kernel): entropies (the diff one 0 for an
  // all-zero row), the three first-token values, the negative mass, D's extremes and the largest |logit|s.
  void add_terms(double e1, double e2, double ediff, double f1, double f2, double fd, double neg, float dmin,
                 float dmax, float ml1, float ml2);
  // The same terms already summed (and min / max reduced) over `count` rows (the CUDA backend's device reduction).
  void add_sums(double e1, double e2, double ediff, double f1, double f2, double fd, double neg, float dmin,
                float dmax, float ml1, float ml2, int64_t count);
  HeadStats finish(bool differential) const;
};

}  // namespace ds
