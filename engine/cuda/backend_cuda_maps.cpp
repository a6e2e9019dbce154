// The CUDA backend's map queries (backend.h; map_query.h defines them): full maps of small prompts, views pooled on
// the device, rows, per-head statistics and row masses, all recomputed from the cached post-RoPE Q/K/V of the last
// forward in chunks of rows, and the implicit attention of a Mamba channel. O(view) or O(rows) back to the host.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <thread>

#include "engine/cuda/detail/backend_cuda_impl.h"
#include "engine/core/error.h"
#include "kernels/attn_fwd_generic.h"
#include "kernels/attn_fwd_sm90.h"
#include "kernels/attn_maps.h"
#include "kernels/diff_attn_fwd.h"
#include "kernels/mamba_implicit.h"
#include "kernels/outlier_count.h"

namespace ds::cuda {

namespace {
constexpr size_t kMapBudget = size_t(256) << 20;  // device bytes for one chunk of maps

// One query row's statistics as the kernels write them (kernels/attn_maps.h, MAP_*), into the accumulator.
void add_row_stats(StatsAccumulator& acc, const float* st) {
  acc.add_terms(st[kern::MAP_ENTROPY1], st[kern::MAP_ENTROPY2], st[kern::MAP_ENTROPY_DIFF], st[kern::MAP_FIRST1],
                st[kern::MAP_FIRST2], st[kern::MAP_FIRST_DIFF], st[kern::MAP_NEG_MASS], st[kern::MAP_DIFF_MIN],
                st[kern::MAP_DIFF_MAX], st[kern::MAP_MAX_LOGIT1], st[kern::MAP_MAX_LOGIT2]);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// maps and statistics

void CudaBackend::compute_maps(int layer, LayerMaps* out, std::vector<HeadStats>* stats, std::optional<float> lambda) {
  if (!has_run_) throw Error("CUDA backend: no forward has run yet, so there are no maps to show");
  const int L = int(cfg_.layers);
  if (layer < 0 || layer >= L)
    throw Error("layer " + std::to_string(layer) + " out of range (the model has " + std::to_string(L) + ")");
  const int64_t n = last_n_;
  const int Hv = view_heads();
  const int nmaps = cfg_.is_diff() ? 2 : 1;
  kern::AttnParams p = layer_params(layer);
  if (lambda && p.diff) p.lambda = *lambda, p.head_coef = nullptr;  // one lambda for every head
  const size_t row_bytes = size_t(Hv) * size_t(nmaps) * size_t(n) * 4;
  const int64_t rpc = std::max<int64_t>(1, std::min<int64_t>(n, int64_t(kMapBudget / row_bytes)));
  if (map_buf_.bytes() < size_t(rpc) * row_bytes) map_buf_ = DeviceBuffer(size_t(rpc) * row_bytes, "attention maps");
  const size_t st_bytes = size_t(Hv) * size_t(rpc) * kern::MAP_NSTAT * 4;
  if (map_stats_.bytes() < st_bytes) map_stats_ = DeviceBuffer(st_bytes, "attention map statistics");
  const bool on_device = out && out->device_out1;  // the caller's device memory (LayerMaps::device_out1)
  if (on_device && nmaps == 2 && !out->device_out2) throw Error("layer maps: no device memory for map 2");
  if (out) {
    out->heads = Hv;
    out->n = n;
    out->a1.resize(on_device ? 0 : size_t(Hv) * size_t(n * n));
    if (nmaps == 2 && !on_device) out->a2.resize(size_t(Hv) * size_t(n * n));
    else out->a2.clear();
  }
  float* const dst1 = on_device ? out->device_out1 : out ? out->a1.data() : nullptr;
  float* const dst2 = on_device ? out->device_out2 : out ? out->a2.data() : nullptr;
  const cudaMemcpyKind kind = on_device ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost;
  std::vector<StatsAccumulator> acc(static_cast<size_t>(Hv));
  std::vector<float> host_st(size_t(Hv) * size_t(rpc) * kern::MAP_NSTAT);
  float* buf = map_buf_.as<float>();
  for (int64_t r0 = 0; r0 < n; r0 += rpc) {
    const int rows = int(std::min(rpc, n - r0));
    timed("attn_maps", layer, [&] {
      DS_CUDA_CHECK(kern::launch_attn_map_logits(p, int(r0), rows, buf, stream()));
      DS_CUDA_CHECK(kern::launch_attn_map_softmax(p, int(r0), rows, buf, map_stats_.as<float>(), stream()));
    });
    if (out)
      for (int h = 0; h < Hv; ++h) {
        DS_CUDA_CHECK(cudaMemcpyAsync(dst1 + (size_t(h) * size_t(n) + size_t(r0)) * size_t(n),
                                      buf + (size_t(h) * nmaps + 0) * size_t(rows) * size_t(n),
                                      size_t(rows) * size_t(n) * 4, kind, stream()));
        if (nmaps == 2)
          DS_CUDA_CHECK(cudaMemcpyAsync(dst2 + (size_t(h) * size_t(n) + size_t(r0)) * size_t(n),
                                        buf + (size_t(h) * nmaps + 1) * size_t(rows) * size_t(n),
                                        size_t(rows) * size_t(n) * 4, kind, stream()));
      }
    if (stats) {
      DS_CUDA_CHECK(cudaMemcpyAsync(host_st.data(), map_stats_.get(), size_t(Hv) * size_t(rows) * kern::MAP_NSTAT * 4,
                                    cudaMemcpyDeviceToHost, stream()));
      sync();
      for (int h = 0; h < Hv; ++h)
        for (int r = 0; r < rows; ++r) {
          const float* st = host_st.data() + (size_t(h) * size_t(rows) + size_t(r)) * kern::MAP_NSTAT;
          add_row_stats(acc[size_t(h)], st);
        }
    }
  }
  sync();
  if (stats) {
    stats->clear();
    for (int h = 0; h < Hv; ++h) stats->push_back(acc[size_t(h)].finish(nmaps == 2));
  }
}

void CudaBackend::layer_maps(int layer, LayerMaps& out) {
  const DeviceGuard on(device_);
  compute_maps(layer, &out, nullptr);
}

// Statistics without maps: the fused two-pass kernel (tensor cores) where it runs, else the map kernels in chunks.
// Either way the per-row terms, [view heads][n][MAP_NSTAT], come to the host and StatsAccumulator reduces them.
std::vector<HeadStats> CudaBackend::head_stats(int layer, std::optional<float> lambda) {
  const DeviceGuard on(device_);
  kern::AttnParams p = layer_params(layer);
  if (lambda && p.diff) p.lambda = *lambda, p.head_coef = nullptr;  // one lambda for every head
  const int Hv = view_heads();
  std::vector<HeadStats> out;
  if (!fused_map_queries(p)) {
    compute_maps(layer, nullptr, &out, lambda);
    return out;
  }
  const int64_t n = last_n_;
  const size_t st_bytes = size_t(Hv) * size_t(n) * kern::MAP_NSTAT * 4;
  if (map_stats_.bytes() < st_bytes) map_stats_ = DeviceBuffer(st_bytes, "attention map statistics");
  if (stats_sum_.bytes() < size_t(Hv) * kern::MAP_NSTAT * 8)
    stats_sum_ = DeviceBuffer(size_t(Hv) * kern::MAP_NSTAT * 8, "attention statistics sums");
  timed("attn_stats", layer, [&] {
    DS_CUDA_CHECK(kern::launch_attn_row_stats(p, map_stats_.as<float>(), stream()));
    DS_CUDA_CHECK(kern::launch_attn_stats_reduce(map_stats_.as<float>(), Hv, int(n), stats_sum_.as<double>(), stream()));
  });
  std::vector<double> sums(size_t(Hv) * kern::MAP_NSTAT);
  DS_CUDA_CHECK(cudaMemcpyAsync(sums.data(), stats_sum_.get(), sums.size() * 8, cudaMemcpyDeviceToHost, stream()));
  sync();
  for (int h = 0; h < Hv; ++h) {
    const double* t = sums.data() + size_t(h) * kern::MAP_NSTAT;
    StatsAccumulator acc;
    acc.add_sums(t[kern::MAP_ENTROPY1], t[kern::MAP_ENTROPY2], t[kern::MAP_ENTROPY_DIFF], t[kern::MAP_FIRST1],
                 t[kern::MAP_FIRST2], t[kern::MAP_FIRST_DIFF], t[kern::MAP_NEG_MASS], float(t[kern::MAP_DIFF_MIN]),
                 float(t[kern::MAP_DIFF_MAX]), float(t[kern::MAP_MAX_LOGIT1]), float(t[kern::MAP_MAX_LOGIT2]), n);
    out.push_back(acc.finish(cfg_.is_diff()));
  }
  return out;
}

// The two-pass tensor-core kernels for statistics and views (kernels/diff_attn_fwd.h): head_dim 64 or 128, H even,
// sm_80+ with room for their shared memory; elsewhere the map kernels run in chunks of rows.
bool CudaBackend::fused_map_queries(const kern::AttnParams& p) const {
  // (the fused kernels take no knockout mask: a layer with one takes the map kernels)
  return p.nko == 0 && p.logit_bits == 0 && (p.d == 64 || p.d == 128) && p.heads % 2 == 0 && (!p.diff || p.kv_heads % 2 == 0) &&
         attn_dev_.cc >= 80 &&
         kern::attn_row_stats_smem(p.d) <= attn_dev_.smem_block;
}

kern::AttnParams CudaBackend::layer_params(int layer) const {
  if (!has_run_) throw Error("no maps: run a prompt first");
  if (layer < 0 || layer >= int(cfg_.layers))
    throw Error("layer " + std::to_string(layer) + " does not exist (the model has " + std::to_string(cfg_.layers) +
                " layers)");
  if (!cfg_.has_maps(layer)) throw Error(cfg_.no_attention(layer, "attention maps"));
  if (act_.host) page_qkv(layer);  // (host caches: the layer's Q/K/V into its device slot)
  return layer_attn(layer, last_n_, 1, last_lambda_.empty() ? 0.f : last_lambda_[size_t(layer)]);  // sequence 0
}

// The view is pooled on the device (the fused two-pass kernel, or the map kernels in chunks) and finished there
// (means, decoded signed maxima): only the grid comes back.
void CudaBackend::map_view(const ViewRequest& req, MapView& out) {
  const DeviceGuard on(device_);
  if (!has_run_) throw Error("no maps: run a prompt first");
  const int L = int(cfg_.layers), Hv = view_heads(), nmaps = cfg_.is_diff() ? 2 : 1;
  float lam = req.layer >= 0 && req.layer < L && !last_lambda_.empty() ? last_lambda_[size_t(req.layer)] : 0.f;
  if (req.layer >= 0 && req.layer < L && req.head >= 0 && req.head < Hv && size_t(req.layer) < has_coef_.size() &&
      has_coef_[size_t(req.layer)])  // the head's own lambda (an intervention)
    lam = head_coef_host_[(size_t(req.layer) * size_t(Hv) + size_t(req.head)) * 2 + 1];
  prepare_view(req, L, Hv, last_n_, cfg_.is_diff(), lam, out, /*zero=*/false);
  kern::AttnParams p = layer_params(out.layer);
  if (p.diff) p.lambda = out.lambda;  // req.lambda, where given
  const size_t cells = size_t(out.rows) * size_t(out.cols);
  if (!req.device_out && view_buf_.bytes() < 3 * cells * 4) view_buf_ = DeviceBuffer(3 * cells * 4, "attention view");
  float* g1 = req.device_out ? req.device_out : view_buf_.as<float>();  // the caller's device memory, or ours
  float* g2 = g1 + cells;
  float* gd = g2 + cells;
  DS_CUDA_CHECK(cudaMemsetAsync(g1, 0, 3 * cells * 4, stream()));
  const kern::ViewPoolArgs va{out.q0, out.q1, out.k0, out.k1, out.rows, out.cols, out.pool == Pool::Mean, out.lambda};
  // The fused kernel where cells are at least 8 rows tall (its warps fold runs of entries in registers); smaller
  // cells favour the chunked map kernels (H100, 1024 x 1024 grid, bench/results/latest/s15_views_* at commit af6a061: 1.6 vs 1.9 ms
  // at 1K tokens, 2.1 vs 2.5 ms at 4K; 4.8 vs 3.4 ms at 8K, 68 vs 6.9 ms at 32K).
  if (fused_views_ && fused_map_queries(p) && out.q1 - out.q0 >= 8 * int64_t(out.rows)) {
    timed("attn_view", out.layer, [&] {
      DS_CUDA_CHECK(kern::launch_attn_map_view(p, va, out.head, g1, nmaps == 2 ? g2 : nullptr, gd, stream()));
    });
  } else {  // one head's full probability rows in chunks (the softmax needs whole rows), each pooled on the device
    const int64_t n = last_n_;
    const size_t row_bytes = size_t(nmaps) * size_t(n) * 4;
    const int64_t rpc = std::max<int64_t>(1, std::min<int64_t>(out.q1 - out.q0, int64_t(kMapBudget / row_bytes)));
    if (map_buf_.bytes() < size_t(rpc) * row_bytes) map_buf_ = DeviceBuffer(size_t(rpc) * row_bytes, "attention maps");
    const size_t st_bytes = size_t(rpc) * kern::MAP_NSTAT * 4;
    if (map_stats_.bytes() < st_bytes) map_stats_ = DeviceBuffer(st_bytes, "attention map statistics");
    float* buf = map_buf_.as<float>();
    for (int64_t r0 = out.q0; r0 < out.q1; r0 += rpc) {
      const int rows = int(std::min(rpc, out.q1 - r0));
      timed("attn_view", out.layer, [&] {
        DS_CUDA_CHECK(kern::launch_attn_map_logits(p, int(r0), rows, buf, stream(), out.head, 1));
        DS_CUDA_CHECK(kern::launch_attn_map_softmax(p, int(r0), rows, buf, map_stats_.as<float>(), stream(), 1));
        DS_CUDA_CHECK(kern::launch_attn_map_pool(buf, nmaps, rows, int(n), int(r0), va, g1, g2, gd, stream()));
      });
    }
  }
  DS_CUDA_CHECK(kern::launch_attn_view_finish(va, g1, nmaps == 2 ? g2 : nullptr, gd, stream()));
  if (req.device_out) {
    sync();  // the caller reads the memory on another stream
  } else if (nmaps == 2) {
    copy_to_host({{out.a1.data(), g1, cells * 4}, {out.a2.data(), g2, cells * 4}, {out.diff.data(), gd, cells * 4}});
  } else {
    copy_to_host({{out.a1.data(), g1, cells * 4}, {out.diff.data(), gd, cells * 4}});
  }
}

// Channel c of Mamba layer l: the scan's inputs of the layer again (as mamba_forward makes them, from the layer's
// cached input and a zero conv state, into the forward's scratch buffers), then the channel's steps and their prefix
// sums. The returned pointers stay valid until the next forward or implicit-attention query.
CudaBackend::ImplicitInputs CudaBackend::implicit_inputs(int l, int c) {
  const int64_t n = last_n_, di = cfg_.d_inner, R = cfg_.dt_rank, S = cfg_.d_state, XD = R + 2 * S;
  const LayerWeights& w = layers_[size_t(l)];
  const size_t steps_bytes = size_t(n) * (4 + 8);
  if (implicit_buf_.bytes() < steps_bytes) implicit_buf_ = DeviceBuffer(steps_bytes, "implicit attention steps");
  double* cum = implicit_buf_.as<double>();
  float* delta = reinterpret_cast<float*>(cum + n);
  run_mamba_inputs(l);  // the Mamba block's first ops again over the layer's cached input: xdbl, dt
  const bf16* dt = act_.scratch32.as<bf16>() + n * 2 * di;
  const bf16* xdbl = act_.xdbl.as<bf16>();
  DS_CUDA_CHECK(kern::launch_mamba_channel_steps(dt, di, c, w.dt_b.as<float>(), n, delta, cum, stream()));
  return {delta, cum, xdbl + R, xdbl + R + S, XD, w.a_neg.as<float>() + size_t(c) * size_t(S), int(S)};
}

void CudaBackend::implicit_grid(const ImplicitInputs& in, const kern::ViewPoolArgs& va, float* grid) {
  DS_CUDA_CHECK(kern::launch_mamba_implicit_view(in.delta, in.cum, in.B, in.C, in.ld_bc, in.A, in.S, va, grid, stream()));
}

// Only the pooled grid comes back.
void CudaBackend::mamba_view(const ViewRequest& req, MapView& out) {
  const DeviceGuard on(device_);
  if (!has_run_) throw Error("no maps: run a prompt first");
  prepare_mamba_view(req, cfg_, last_n_, out, /*zero=*/false);
  if (last_batch_ != 1) throw Error("implicit attention maps need a forward of one sequence");
  const size_t cells = size_t(out.rows) * size_t(out.cols);
  if (view_buf_.bytes() < cells * 4) view_buf_ = DeviceBuffer(cells * 4, "attention view");
  float* grid = req.device_out ? req.device_out : view_buf_.as<float>();  // [3, cells] there: a1, (a2), diff
  timed("mamba_view", out.layer, [&] {
    const ImplicitInputs in = implicit_inputs(out.layer, out.head);
    implicit_grid(in, {out.q0, out.q1, out.k0, out.k1, out.rows, out.cols, out.pool == Pool::Mean, 0.f}, grid);
  });
  if (req.device_out) {
    DS_CUDA_CHECK(cudaMemcpyAsync(grid + 2 * cells, grid, cells * 4, cudaMemcpyDeviceToDevice, stream()));
    sync();
    return;
  }
  copy_to_host({{out.diff.data(), view_buf_.get(), cells * 4}});
  out.a1 = out.diff;
}

// The row as one 1 x (q + 1) grid: one cell per key.
void CudaBackend::mamba_row(int layer, int channel, int64_t q, std::vector<float>& row) {
  const DeviceGuard on(device_);
  if (!has_run_) throw Error("no maps: run a prompt first");
  check_mamba_row(layer, channel, q, cfg_, last_n_);
  if (last_batch_ != 1) throw Error("implicit attention maps need a forward of one sequence");
  const size_t cells = size_t(q + 1);
  if (view_buf_.bytes() < cells * 4) view_buf_ = DeviceBuffer(cells * 4, "attention view");
  timed("mamba_view", layer, [&] {
    implicit_grid(implicit_inputs(layer, channel), {q, q + 1, 0, q + 1, 1, int(q + 1), false, 0.f},
                  view_buf_.as<float>());
  });
  row.resize(cells);
  copy_to_host({{row.data(), view_buf_.get(), cells * 4}});
}

// Device -> pageable host memory. cudaMemcpy to pageable memory stages through the driver's buffers at a fraction
// of the link's speed, and one thread's memcpy out of pinned memory is slower than the link: every piece (<= 1 MB)
// is copied into pinned staging at once, each with an event, and up to 4 threads (from 8 MB on) move the pieces into
// place as they land. Rounds of at most 64 MB.
void CudaBackend::copy_to_host(const std::vector<HostCopy>& copies) {
  constexpr size_t kPiece = size_t(1) << 20, kRound = size_t(64) << 20;
  struct Piece {
    char* dst;
    const char* src;
    size_t bytes;
  };
  std::vector<Piece> pieces;
  for (const HostCopy& c : copies)
    for (size_t o = 0; o < c.bytes; o += kPiece)
      pieces.push_back({static_cast<char*>(c.dst) + o, static_cast<const char*>(c.src) + o, std::min(kPiece, c.bytes - o)});
  for (size_t first = 0; first < pieces.size();) {
    size_t last = first, staged = 0;
    while (last < pieces.size() && staged + pieces[last].bytes <= kRound) staged += pieces[last++].bytes;
    if (host_stage_.bytes() < staged) host_stage_ = PinnedBuffer(staged);
    while (stage_ev_.size() < last - first) stage_ev_.emplace_back();
    std::vector<char*> at(last - first);
    size_t off = 0;
    for (size_t i = first; i < last; ++i) {
      at[i - first] = host_stage_.as<char>() + off;
      off += pieces[i].bytes;
      DS_CUDA_CHECK(cudaMemcpyAsync(at[i - first], pieces[i].src, pieces[i].bytes, cudaMemcpyDeviceToHost, stream()));
      DS_CUDA_CHECK(cudaEventRecord(stage_ev_[i - first].get(), stream()));
    }
    // (threads only for a large copy: starting them costs more than a few MB of memcpy)
    const size_t count = last - first, workers = staged >= (size_t(8) << 20) ? std::min<size_t>(4, count) : 1;
    std::vector<std::string> errors(workers);
    auto work = [&](size_t w) {
      try {
        for (size_t i = w; i < count; i += workers) {
          DS_CUDA_CHECK(cudaEventSynchronize(stage_ev_[i].get()));
          std::memcpy(pieces[first + i].dst, at[i], pieces[first + i].bytes);
        }
      } catch (const std::exception& e) {
        errors[w] = e.what();
      }
    };
    {
      std::vector<std::jthread> threads;
      for (size_t w = 1; w < workers; ++w) threads.emplace_back(work, w);
      work(0);
    }  // joined
    for (const std::string& e : errors)
      if (!e.empty()) throw Error(e);
    first = last;
  }
}

// One launch pair per position, every head at once; each row comes back whole (heads x maps x n floats).
void CudaBackend::map_rows(int layer, const std::vector<int64_t>& positions, MapRows& out) {
  const DeviceGuard on(device_);
  const kern::AttnParams p = layer_params(layer);
  const int64_t n = last_n_, Hv = view_heads();
  const int nmaps = cfg_.is_diff() ? 2 : 1;
  prepare_rows(layer, Hv, n, nmaps == 2, positions, out);
  const size_t P = out.positions.size();
  const size_t row_bytes = size_t(Hv) * size_t(nmaps) * size_t(n) * 4;
  if (map_buf_.bytes() < row_bytes) map_buf_ = DeviceBuffer(row_bytes, "attention maps");
  if (map_stats_.bytes() < size_t(Hv) * kern::MAP_NSTAT * 4)
    map_stats_ = DeviceBuffer(size_t(Hv) * kern::MAP_NSTAT * 4, "attention map statistics");
  float* buf = map_buf_.as<float>();
  float* const dst1 = out.rows1();
  float* const dst2 = out.rows2();
  for (size_t i = 0; i < P; ++i) {
    const int q = int(out.positions[i]);
    timed("attn_rows", layer, [&] {
      DS_CUDA_CHECK(kern::launch_attn_map_logits(p, q, 1, buf, stream()));
      DS_CUDA_CHECK(kern::launch_attn_map_softmax(p, q, 1, buf, map_stats_.as<float>(), stream()));
    });
    for (int64_t h = 0; h < Hv; ++h)
      for (int m = 0; m < nmaps; ++m) {  // synchronous: buf is reused by the next position
        float* dst = (m == 0 ? dst1 : dst2) + (size_t(h) * P + i) * size_t(n);
        const float* src = buf + (size_t(h) * nmaps + size_t(m)) * size_t(n);
        if (out.on_device()) DS_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(n) * 4, cudaMemcpyDeviceToDevice, stream()));
        else copy_to_host({{dst, src, size_t(n) * 4}});
      }
  }
  if (out.on_device()) sync();
}

// The row as map_rows computes it, then reduced per head on the device: 12 f64 per head and layer come back, after
// one wait for all the layers.
std::vector<RowMass> CudaBackend::row_mass(int layer, int64_t q, int64_t a0, int64_t a1) {
  return row_masses({layer}, q, a0, a1).at(0);
}

std::vector<std::vector<RowMass>> CudaBackend::row_masses(const std::vector<int>& layers, int64_t q, int64_t a0,
                                                          int64_t a1) {
  if (layers.empty()) return {};
  const DeviceGuard on(device_);
  const int64_t n = last_n_, Hv = view_heads();
  for (int layer : layers) layer_params(layer);  // (checks each layer)
  check_row_mass(q, n, a0, a1);
  const int nmaps = cfg_.is_diff() ? 2 : 1;
  const size_t row_bytes = size_t(Hv) * size_t(nmaps) * size_t(n) * 4, per_layer = size_t(Hv) * 12;
  if (map_buf_.bytes() < row_bytes) map_buf_ = DeviceBuffer(row_bytes, "attention maps");
  if (map_stats_.bytes() < size_t(Hv) * kern::MAP_NSTAT * 4)
    map_stats_ = DeviceBuffer(size_t(Hv) * kern::MAP_NSTAT * 4, "attention map statistics");
  if (stats_sum_.bytes() < layers.size() * per_layer * 8)
    stats_sum_ = DeviceBuffer(layers.size() * per_layer * 8, "row mass sums");
  float* buf = map_buf_.as<float>();
  for (size_t i = 0; i < layers.size(); ++i) {  // (one map buffer: the stream orders the layers' uses of it)
    const kern::AttnParams p = layer_params(layers[i]);  // (host caches: paged in here, a layer at a time)
    timed("attn_row_mass", layers[i], [&] {
      DS_CUDA_CHECK(kern::launch_attn_map_logits(p, int(q), 1, buf, stream()));
      DS_CUDA_CHECK(kern::launch_attn_map_softmax(p, int(q), 1, buf, map_stats_.as<float>(), stream()));
      DS_CUDA_CHECK(kern::launch_attn_row_mass(buf, int(Hv), nmaps, int(n), int(q), p.diff ? p.lambda : 0.f, int(a0),
                                               int(a1), stats_sum_.as<double>() + i * per_layer, stream()));
    });
  }
  std::vector<double> sums(layers.size() * per_layer);
  DS_CUDA_CHECK(cudaMemcpyAsync(sums.data(), stats_sum_.get(), sums.size() * 8, cudaMemcpyDeviceToHost, stream()));
  sync();
  std::vector<std::vector<RowMass>> out(layers.size(), std::vector<RowMass>(static_cast<size_t>(Hv)));
  for (size_t i = 0; i < layers.size(); ++i)
    for (size_t h = 0; h < size_t(Hv); ++h)
      for (int m = 0; m < MASS_NMAPS; ++m) {
        const double* x = sums.data() + i * per_layer + h * 12;
        out[i][h].answer[m] = x[size_t(m)];
        out[i][h].sink[m] = x[4 + size_t(m)];
        out[i][h].context[m] = x[8 + size_t(m)];
      }
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// outlier statistics (session_outliers.h): radix passes over the stream leaving a layer (in place) or over its
// logit rows, recomputed chunk by chunk into map_buf_ as the map queries do; only counts and values come back.

const float* CudaBackend::outlier_stream(int layer) {
  if (!has_run_ || last_batch_ != 1) throw Error("no result: run a prompt first");
  if (layer < 0 || layer >= int(cfg_.layers) || (layer == int(cfg_.layers) - 1 && partial_last_layer_))
    throw Error("internal: outlier statistics of layer " + std::to_string(layer) + " without every row");
  if (act_.host) page_stream(layer + 1);
  return stream_ptr(layer + 1);
}

template <class F>
void CudaBackend::outlier_cells(int layer, bool logits, F&& f) {
  if (!has_run_ || last_batch_ != 1) throw Error("no result: run a prompt first");
  const int64_t n = last_n_, E = cfg_.hidden;
  if (!logits) {
    kern::OutlierCells c;
    c.x = outlier_stream(layer);
    c.n = n * E;
    return f(c);
  }
  kern::AttnParams p = layer_params(layer);
  p.nko = 0;  // the logits themselves (a knockout hides cells from the softmax, not from q.k)
  const int Hv = view_heads(), nmaps = cfg_.is_diff() ? 2 : 1, G = Hv * nmaps;
  const size_t row_bytes = size_t(Hv) * size_t(nmaps) * size_t(n) * 4;
  const int64_t rpc = std::max<int64_t>(1, std::min<int64_t>(n, int64_t(kMapBudget / row_bytes)));
  if (map_buf_.bytes() < size_t(rpc) * row_bytes) map_buf_ = DeviceBuffer(size_t(rpc) * row_bytes, "attention maps");
  // The rows' logits on the tensor cores: per chunk one batched bf16 GEMM over the G = view heads x maps groups,
  // group g's [rows][n] block = scale Q_g K_g^T over the keys up to the chunk's last row (the count kernel takes the
  // causal cells inside the window). Products of bf16 values are exact in f32, so only the order of the sums differs
  // from the map kernels' f32 CUDA-core dot products, which made these statistics 59x a 4K forward.
  if (logit_ptrs_.bytes() < size_t(3 * G) * sizeof(void*)) logit_ptrs_ = DeviceBuffer(size_t(3 * G) * sizeof(void*), "logit GEMM pointers");
  const bf16* kvb = kern::kv_base(p);
  for (int64_t r0 = 0; r0 < n; r0 += rpc) {
    const int rows = int(std::min(rpc, n - r0));
    const int keys = int(r0) + rows;  // keys right of the chunk's last row are masked for all of its rows
    std::vector<const void*> ptr(size_t(3 * G));
    for (int j = 0; j < Hv; ++j)
      for (int m = 0; m < nmaps; ++m) {
        const kern::ViewHeadMap hm = kern::view_head_map(p.diff, j, p.heads, p.kv_heads);
        const int g = j * nmaps + m;
        ptr[size_t(g)] = kvb + p.k_off + int64_t(hm.k[m]) * p.d;                                  // A: K of the map
        ptr[size_t(G + g)] = p.qkv + r0 * p.row_stride + p.q_off + int64_t(hm.q[m]) * p.d;          // B: the rows' Q
        ptr[size_t(2 * G + g)] = map_buf_.as<float>() + int64_t(g) * rows * n;                      // C: [rows][n]
      }
    DS_CUDA_CHECK(cudaMemcpyAsync(logit_ptrs_.get(), ptr.data(), ptr.size() * sizeof(void*), cudaMemcpyHostToDevice, stream()));
    const void* const* dp = static_cast<const void* const*>(logit_ptrs_.get());
    const float alpha = p.scale, beta = 0.f;
    // column-major: C^T [keys x rows] (ldc n) = K [keys x d] (row-major K read as d x keys, transposed) x Q^T [d x rows]
    DS_CUBLAS_CHECK(cublasGemmBatchedEx(blas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, keys, rows, p.d, &alpha, dp,
                                        CUDA_R_16BF, int(p.row_stride), dp + G, CUDA_R_16BF, int(p.row_stride), &beta,
                                        const_cast<void* const*>(dp + 2 * G), CUDA_R_32F, int(n), G,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    kern::OutlierCells c;
    c.x = map_buf_.as<float>();
    c.groups = int64_t(Hv) * nmaps, c.rows = rows, c.n = n, c.nmaps = nmaps;
    c.causal = true, c.row0 = int(r0), c.window = p.window;
    f(c);
  }
}

namespace {
std::atomic<int64_t> g_logit_pass_launches{0};
}  // namespace

void CudaBackend::outlier_logit_pass(int layer, int shift, int width, const uint32_t* prefixes, int nprefix,
                                     unsigned long long* counts, const kern::OutlierCollect& collect) {
  if (logit_pass_fused_ && attn_dev_.sm90a && attn_dev_.tma) {
    if (!has_run_ || last_batch_ != 1) throw Error("no result: run a prompt first");
    kern::AttnParams p = layer_params(layer);
    p.nko = 0;  // (the logits themselves, as below)
    if (kern::attn_shape(p).aligned16 && kern::logit_pass_sm90_supports(p)) {
      kern::LogitPass lp;
      lp.shift = shift, lp.width = width, lp.prefixes = prefixes, lp.nprefix = nprefix, lp.counts = counts;
      lp.collect = collect;
      DS_CUDA_CHECK(kern::launch_logit_pass_sm90(p, lp, stream()));
      g_logit_pass_launches.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
  outlier_cells(layer, true, [&](const kern::OutlierCells& c) {
    if (width == 0)
      DS_CUDA_CHECK(kern::launch_outlier_collect(c, collect.at_least, collect.out, collect.cap, collect.found, stream()));
    else
      DS_CUDA_CHECK(kern::launch_outlier_count(c, shift, width, prefixes, nprefix, counts, stream(), collect));
  });
}

void CudaBackend::outlier_counts(int layer, bool logits, const RadixPass& pass, std::vector<uint64_t>& counts) {
  std::vector<std::vector<uint64_t>> c;
  outlier_counts_many({OutlierQuery{layer, logits, pass, {}, 0}}, c, nullptr);
  counts = std::move(c.at(0));
}

namespace {
size_t align16(size_t x) { return (x + 15) & ~size_t(15); }
constexpr size_t kFirstCap = 1024;  // values collected per map in a batched call; a query that finds more runs again
// (a logit query may ask for more, up to kLogitCap: a long prompt's top bucket holds thousands of logits)
constexpr size_t kLogitCap = size_t(1) << 16;
}  // namespace

// Every query's pass in one call: one upload (prefixes, the dense sources' table, thresholds), the hidden states of
// every layer counted by one launch (kern::launch_outlier_count_dense), each layer's logits by outlier_logit_pass
// (counted and collected where they are computed), one copy back of the counts, the
// numbers found and the values collected (those found alone, where a logit query's room passes kFirstCap). A query
// that found more than its room (kFirstCap; a logit query's cap up to kLogitCap) collects again alone with its cap.
void CudaBackend::outlier_counts_many(const std::vector<OutlierQuery>& q, std::vector<std::vector<uint64_t>>& counts,
                                      OutlierValues* values) {
  const DeviceGuard on(device_);
  const size_t Q = q.size();
  if (act_.host && Q > 1) {  // host caches: one layer's rows in a slot at a time, so one query a call
    counts.assign(Q, {});
    if (values) values->assign(Q, {});
    for (size_t i = 0; i < Q; ++i) {
      std::vector<std::vector<uint64_t>> c;
      OutlierValues v;
      outlier_counts_many({q[i]}, c, values ? &v : nullptr);
      counts[i] = std::move(c.at(0));
      if (values) (*values)[i] = std::move(v.at(0));
    }
    return;
  }
  // Counts: the logit queries' u64 (a layer's causal logits can pass 2^32), the hidden states' u32 (half the copy).
  std::vector<size_t> at(Q + 1, 0), at32(Q + 1, 0), pre_at(Q), slot(Q + 1, 0);  // offsets; each query's first map slot
  std::vector<size_t> room(Q, 0), vat;  // values a slot of query i holds; each slot's first value
  std::vector<uint32_t> prefixes;
  std::vector<int> nmaps(Q);
  for (size_t i = 0; i < Q; ++i) {
    nmaps[i] = q[i].logits && cfg_.is_diff() ? 2 : 1;
    const bool collects = values && !q[i].at_least.empty();
    if (collects && (q[i].at_least.size() < size_t(nmaps[i]) || q[i].cap == 0 || q[i].cap > (size_t(1) << 24)))
      throw Error("internal: outlier_counts_many thresholds");
    const size_t size = size_t(nmaps[i]) * size_t(q[i].pass.histograms()) * size_t(q[i].pass.bins());
    at[i + 1] = at[i] + (q[i].logits ? size : 0);
    at32[i + 1] = at32[i] + (q[i].logits ? 0 : size);
    slot[i + 1] = slot[i] + (collects ? size_t(nmaps[i]) : 0);
    room[i] = collects ? (q[i].logits ? std::min(std::max(q[i].cap, kFirstCap), kLogitCap) : kFirstCap) : 0;
    pre_at[i] = prefixes.size();
    prefixes.insert(prefixes.end(), q[i].pass.prefixes.begin(), q[i].pass.prefixes.end());
  }
  const size_t S = slot.back();
  size_t V = 0;  // values in all
  for (size_t i = 0; i < Q; ++i)
    for (size_t m = slot[i]; m < slot[i + 1]; ++m) vat.push_back(V), V += room[i];
  std::vector<float> thr(S);
  for (size_t i = 0; i < Q; ++i)
    for (size_t m = 0; m < slot[i + 1] - slot[i]; ++m) thr[slot[i] + m] = q[i].at_least[m];
  std::vector<kern::DenseSource> dense;  // the hidden-state queries, one launch
  std::vector<size_t> dense_q;
  for (size_t i = 0; i < Q; ++i) {
    if (q[i].logits) continue;
    kern::DenseSource d;
    d.x = outlier_stream(q[i].layer);
    d.count = last_n_ * cfg_.hidden;
    d.prefix_at = int(pre_at[i]);
    d.nprefix = int(q[i].pass.prefixes.size());
    d.counts_at = int64_t(at32[i]);
    if (slot[i + 1] > slot[i]) d.at_least = thr[slot[i]], d.collect_at = int64_t(vat[slot[i]]), d.cap = int(room[i]);
    dense.push_back(d);
    dense_q.push_back(i);
  }
  // [u64 counts | u32 counts | found u32: S slots, then one per dense source | values f32 (V: each slot's room) |
  // the upload: prefixes u32, thresholds f32, the dense table]
  const size_t o_c32 = align16(at.back() * 8), o_found = align16(o_c32 + at32.back() * 4),
               o_vals = align16(o_found + (S + dense.size()) * 4), o_up = align16(o_vals + V * 4),
               o_thr = align16(o_up + prefixes.size() * 4), o_dense = align16(o_thr + S * 4);
  const size_t bytes = o_dense + dense.size() * sizeof(kern::DenseSource);
  if (outlier_buf_.bytes() < bytes) outlier_buf_ = DeviceBuffer(bytes, "outlier statistics");
  char* base = outlier_buf_.as<char>();
  auto* cnt = reinterpret_cast<unsigned long long*>(base);
  auto* cnt32 = reinterpret_cast<unsigned*>(base + o_c32);
  auto* found = reinterpret_cast<unsigned*>(base + o_found);
  auto* vals = reinterpret_cast<float*>(base + o_vals);
  auto* pre = reinterpret_cast<uint32_t*>(base + o_up);
  auto* dthr = reinterpret_cast<float*>(base + o_thr);
  auto* dtab = reinterpret_cast<kern::DenseSource*>(base + o_dense);
  std::vector<char> up(bytes - o_up, 0);  // the upload, one copy
  if (!prefixes.empty()) std::memcpy(up.data(), prefixes.data(), prefixes.size() * 4);
  if (!thr.empty()) std::memcpy(up.data() + (o_thr - o_up), thr.data(), thr.size() * 4);
  if (!dense.empty()) std::memcpy(up.data() + (o_dense - o_up), dense.data(), dense.size() * sizeof(kern::DenseSource));
  DS_CUDA_CHECK(cudaMemsetAsync(cnt, 0, o_vals, stream()));  // the counts and the numbers found
  if (!up.empty()) DS_CUDA_CHECK(cudaMemcpyAsync(base + o_up, up.data(), up.size(), cudaMemcpyHostToDevice, stream()));
  if (!dense.empty()) {
    int64_t max_count = 0;
    int max_pre = 0;
    for (const kern::DenseSource& d : dense) max_count = std::max(max_count, d.count), max_pre = std::max(max_pre, d.nprefix);
    if (max_count > int64_t(UINT32_MAX)) throw Error("internal: a layer's hidden states hold 2^32 values or more");
    const RadixPass& pass = q[dense_q[0]].pass;
    for (size_t i : dense_q)
      if (q[i].pass.shift != pass.shift || q[i].pass.width != pass.width)
        throw Error("internal: the hidden states' passes of one call differ in their digits");
    DS_CUDA_CHECK(kern::launch_outlier_count_dense(dtab, int(dense.size()), max_count, max_pre, pass.shift, pass.width,
                                                   pre, cnt32, vals, found + S, stream()));
  }
  for (size_t i = 0; i < Q; ++i) {
    if (!q[i].logits) continue;
    const RadixPass& pass = q[i].pass;
    kern::OutlierCollect k;
    if (slot[i + 1] > slot[i])
      k = kern::OutlierCollect{dthr + slot[i], vals + vat[slot[i]], int(room[i]), found + slot[i]};
    if (pass.width == 0 && !k.at_least) continue;  // nothing to count or collect
    outlier_logit_pass(q[i].layer, pass.shift, pass.width, pre + pre_at[i], int(pass.prefixes.size()), cnt + at[i], k);
  }
  // One copy back: the counts, the numbers found and the collected values (4 KB a slot); where a slot has more
  // room, the values found come in a second copy.
  std::vector<uint64_t> c64(at.back());
  std::vector<uint32_t> c32(at32.back());
  std::vector<unsigned> nf(S + dense.size());
  std::vector<float> host(V);
  const bool small = V <= S * kFirstCap;
  std::vector<HostCopy> copies = {{c64.data(), cnt, c64.size() * 8}, {c32.data(), cnt32, c32.size() * 4},
                                  {nf.data(), found, nf.size() * 4}};
  if (small) copies.push_back({host.data(), vals, host.size() * 4});
  copy_to_host(copies);
  counts.resize(Q);
  for (size_t i = 0; i < Q; ++i) {
    if (q[i].logits) counts[i].assign(c64.begin() + long(at[i]), c64.begin() + long(at[i + 1]));
    else counts[i].assign(c32.begin() + long(at32[i]), c32.begin() + long(at32[i + 1]));
  }
  if (!values) return;
  for (size_t j = 0; j < dense.size(); ++j)  // the dense kernel's per-source counters into the slots'
    if (dense[j].collect_at >= 0) nf[slot[dense_q[j]]] = nf[S + j];
  std::vector<bool> fits(Q, true);
  for (size_t i = 0; i < Q; ++i)
    for (size_t m = slot[i]; m < slot[i + 1]; ++m) fits[i] = fits[i] && nf[m] <= std::min(room[i], q[i].cap);
  if (!small) {
    copies.clear();
    for (size_t i = 0; i < Q; ++i)
      for (size_t m = slot[i]; fits[i] && m < slot[i + 1]; ++m)
        if (nf[m]) copies.push_back({host.data() + vat[m], vals + vat[m], size_t(nf[m]) * 4});
    if (!copies.empty()) copy_to_host(copies);
  }
  values->assign(Q, {});
  for (size_t i = 0; i < Q; ++i) {
    if (slot[i + 1] == slot[i]) continue;
    if (!fits[i]) {
      (*values)[i] = outlier_values(q[i].layer, q[i].logits, q[i].at_least, q[i].cap);
      continue;
    }
    for (size_t m = slot[i]; m < slot[i + 1]; ++m)
      (*values)[i].emplace_back(host.data() + vat[m], host.data() + vat[m] + nf[m]);
  }
}

std::vector<std::vector<std::vector<float>>> CudaBackend::outlier_values_many(const std::vector<OutlierQuery>& q) {
  std::vector<OutlierQuery> collect = q;
  for (OutlierQuery& x : collect) x.pass = RadixPass{0, 0, {}};  // width 0: collect only
  std::vector<std::vector<uint64_t>> counts;
  OutlierValues out;
  outlier_counts_many(collect, counts, &out);
  return out;
}

std::vector<std::vector<float>> CudaBackend::outlier_values(int layer, bool logits, const std::vector<float>& at_least,
                                                           size_t cap) {
  const DeviceGuard on(device_);
  const int nmaps = logits && cfg_.is_diff() ? 2 : 1;
  if (at_least.size() < size_t(nmaps) || cap == 0 || cap > (size_t(1) << 24)) throw Error("internal: outlier_values");
  const size_t bytes = size_t(nmaps) * (cap * 4 + 8);
  if (outlier_buf_.bytes() < bytes) outlier_buf_ = DeviceBuffer(bytes, "outlier statistics");
  float* vals = outlier_buf_.as<float>();
  float* thr = vals + size_t(nmaps) * cap;
  auto* found = reinterpret_cast<unsigned*>(thr + nmaps);
  DS_CUDA_CHECK(cudaMemcpyAsync(thr, at_least.data(), size_t(nmaps) * 4, cudaMemcpyHostToDevice, stream()));
  DS_CUDA_CHECK(cudaMemsetAsync(found, 0, size_t(nmaps) * 4, stream()));
  timed("outlier_collect", layer, [&] {
    if (logits) {
      outlier_logit_pass(layer, 0, 0, nullptr, 0, nullptr, kern::OutlierCollect{thr, vals, int(cap), found});
      return;
    }
    outlier_cells(layer, false, [&](const kern::OutlierCells& c) {
      DS_CUDA_CHECK(kern::launch_outlier_collect(c, thr, vals, int(cap), found, stream()));
    });
  });
  std::vector<unsigned> nf(static_cast<size_t>(nmaps));
  copy_to_host({{nf.data(), found, size_t(nmaps) * 4}});
  std::vector<std::vector<float>> out(static_cast<size_t>(nmaps));
  for (int m = 0; m < nmaps; ++m) {  // only what was found comes back (cap is a bound, not the usual size)
    if (nf[size_t(m)] > cap) throw Error("internal: more outlier values than asked for");
    out[size_t(m)].resize(nf[size_t(m)]);
    if (nf[size_t(m)]) copy_to_host({{out[size_t(m)].data(), vals + size_t(m) * cap, size_t(nf[size_t(m)]) * 4}});
  }
  return out;
}

// The hidden states' selection on the device (kern::launch_outlier_select): three counting passes over every layer's
// stream, each followed by the selection's step, and a collection pass, all queued; one copy back (the ranks' values,
// the numbers found and the values collected). A layer whose top values did not fold into a collection of at most
// kFirstCap (ties at its 100th value) collects them again alone.
bool CudaBackend::outlier_hidden_select(HiddenSelection& out) {
  const DeviceGuard on(device_);
  const int L = int(cfg_.layers);
  const int64_t count = last_n_ * cfg_.hidden;
  if (!device_select_ || act_.host || first_ != 0 || end_layer() != L || L > kern::kMaxSelectSources || count < 1 ||
      count > int64_t(UINT32_MAX))
    return false;
  constexpr int K = kern::kSelectPrefixes, kBins = 4096, cap = int(kFirstCap);
  const size_t R = size_t(3 * L + 2);
  constexpr int kTop = 100;  // (the summary's largest: top_median_ranks' first rank)
  // [table | ranks | prefixes u32 | counts u32 | found u32 | error | values f32 | copies' counts u32 | top f32]
  const size_t o_ranks = align16(size_t(L) * sizeof(kern::DenseSource)),
               o_pre = align16(o_ranks + R * sizeof(kern::RankState)), o_cnt = align16(o_pre + size_t(L) * K * 4),
               o_found = align16(o_cnt + size_t(L) * K * kBins * 4), o_err = o_found + size_t(L) * 4,
               o_vals = align16(o_err + 4), o_cn = align16(o_vals + size_t(L) * cap * 4),
               o_top = align16(o_cn + size_t(L) * 4), bytes = o_top + size_t(L) * kTop * 4;
  if (outlier_buf_.bytes() < bytes) outlier_buf_ = DeviceBuffer(bytes, "outlier statistics");
  char* base = outlier_buf_.as<char>();
  kern::SelectPlan plan;
  plan.nsources = L;
  plan.table = reinterpret_cast<kern::DenseSource*>(base);
  plan.ranks = reinterpret_cast<kern::RankState*>(base + o_ranks);
  plan.prefixes = reinterpret_cast<uint32_t*>(base + o_pre);
  plan.counts = reinterpret_cast<unsigned*>(base + o_cnt);
  plan.cap = cap;
  plan.error = reinterpret_cast<int*>(base + o_err);
  auto* found = reinterpret_cast<unsigned*>(base + o_found);
  auto* vals = reinterpret_cast<float*>(base + o_vals);
  std::vector<char> up(o_pre, 0);  // the table and the ranks, one upload
  auto* table = reinterpret_cast<kern::DenseSource*>(up.data());
  auto* ranks = reinterpret_cast<kern::RankState*>(up.data() + o_ranks);
  for (int l = 0; l < L; ++l) {
    kern::DenseSource d;
    d.x = outlier_stream(l);
    d.count = count;
    d.counts_at = int64_t(l) * K * kBins;
    table[l] = d;
    const std::vector<uint64_t> rk = top_median_ranks(uint64_t(count));
    for (int k = 0; k < 3; ++k) ranks[3 * l + k] = kern::RankState{rk[size_t(k)], rk[size_t(k)]};
  }
  const std::vector<uint64_t> all = top_median_ranks(uint64_t(count) * uint64_t(L));
  ranks[3 * L] = kern::RankState{all[1], all[1]};
  ranks[3 * L + 1] = kern::RankState{all[2], all[2]};
  // The copy the later passes read: an eighth of the values, where that memory is there (else the whole states).
  const int64_t ccap = std::min<int64_t>(count, ((std::max<int64_t>(count / 8, 4096) + 3) / 4) * 4);
  const size_t cbytes = size_t(L) * size_t(ccap) * 4;
  if (select_compact_ && outlier_compact_.bytes() < cbytes) {
    outlier_compact_ = DeviceBuffer{};
    if (has_spare(cbytes)) outlier_compact_ = DeviceBuffer(cbytes, "outlier statistics");
  }
  if (select_compact_ && outlier_compact_.bytes() >= cbytes) {
    plan.compact = outlier_compact_.as<float>();
    plan.compact_cap = ccap;
    plan.compact_n = reinterpret_cast<unsigned*>(base + o_cn);
  }
  DS_CUDA_CHECK(cudaMemcpyAsync(base, up.data(), up.size(), cudaMemcpyHostToDevice, stream()));
  DS_CUDA_CHECK(cudaMemsetAsync(base + o_found, 0, o_vals - o_found, stream()));  // found, error
  timed("outlier_select", -1, [&] {
    DS_CUDA_CHECK(kern::launch_outlier_select_passes(plan, RankFinder::kPasses, kRadixShift, kRadixWidth, count, vals,
                                                     found, stream()));
    DS_CUDA_CHECK(
        kern::launch_outlier_sort_top(plan, vals, found, reinterpret_cast<float*>(base + o_top), kTop, stream()));
  });
  std::vector<kern::RankState> got(R);
  std::vector<unsigned> nf(size_t(L) + 1);  // found, then the error flag
  std::vector<float> host(size_t(L) * kTop);
  copy_to_host({{got.data(), plan.ranks, R * sizeof(kern::RankState)},
                {nf.data(), found, (size_t(L) + 1) * 4},
                {host.data(), base + o_top, host.size() * 4}});
  if (nf[size_t(L)]) throw Error("internal: the outlier selection on the device lost a rank");
  auto value = [&](size_t i) {
    float v;
    std::memcpy(&v, &got[i].prefix, 4);
    return v;
  };
  out.top.assign(size_t(L), {});
  out.middle.assign(size_t(L), {});
  for (int l = 0; l < L; ++l) {
    const unsigned n = nf[size_t(l)];
    if (n <= unsigned(cap)) {  // sorted on the device, its largest kTop
      const float* t = host.data() + size_t(l) * kTop;
      out.top[size_t(l)].assign(t, t + std::min(n, unsigned(kTop)));
    } else {  // (folded only at the last pass: its exact 100th value, and more than cap values at or above it)
      out.top[size_t(l)] = outlier_values(l, false, {value(size_t(3 * l))},
                                          size_t(std::min<int64_t>(count, int64_t(1) << 22)))[0];
    }
    out.middle[size_t(l)] = {value(size_t(3 * l + 1)), value(size_t(3 * l + 2))};
  }
  out.model_middle = {value(size_t(3 * L)), value(size_t(3 * L + 1))};
  return true;
}

}  // namespace ds::cuda

namespace ds {
int64_t cuda_logit_pass_launches() { return cuda::g_logit_pass_launches.load(); }
}  // namespace ds
