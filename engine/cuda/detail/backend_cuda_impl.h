// The CUDA backend's class, shared by its units (backend_cuda.cpp: memory, caches, runs; backend_cuda_ops.cpp: the
// forward's operations; backend_cuda_decode.cpp: the decoding step; backend_cuda_maps.cpp: map queries;
// backend_cuda_gemm.cpp: GEMM plans; backend_cuda_upload.cpp: weights) and by the CUDA benchmarks and tests, which
// need batches, random weights and the backend's switches.
//
// Device state, for a model with L layers, hidden size E, H query heads, Hkv kv heads, head_dim d,
// W = (H + 2 Hkv) d, intermediate I, and T = batch x n tokens:
//   weights (bf16 unless noted): per layer qkv [W, E] (q|k|v rows stacked), o [E, H d], gate_up [2I, E]
//     (gate|up rows stacked), down [E, I], ln1/ln2 [E] f32; embed [vocab, E]; lm_head [vocab, E] (shares embed
//     when tied); final_norm [E] f32; inv_freq [d/2] f32
//   activations: hidden [L+1][T][E] f32 (input of every layer: a lambda change re-runs from a middle layer),
//     qkv_cache [L][T][W] bf16 (post-RoPE Q/K/V of every layer: the maps are recomputed from it on demand),
//     scratch32 [T][max(I, E)] x 4 bytes (the gate/up GEMM's bf16 output [T][2I], and the down GEMM's f32
//     [T][E] output while its algorithm is being timed), x [T][E] bf16 (normed
//     GEMM input), attn [T][H d] bf16, act [T][I] bf16, ids [T], cos_sin [n][d/2] float2
//   GEMMs: cuBLASLt, one plan (descriptors + algorithm) per shape, kept for the backend's lifetime
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <compare>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/backend.h"
#include "engine/cuda/backend_cuda.h"
#include "engine/cuda/detail/backend_cuda_memory.h"
#include "engine/core/config.h"
#include "engine/core/forward.h"
#include "kernels/attn_dispatch.h"
#include "kernels/attn_maps.h"
#include "kernels/outlier_count.h"
#include "engine/core/model.h"

namespace ds::cuda {

using bf16 = __nv_bfloat16;

struct LayerWeights {
  DeviceBuffer qkv, o, gate_up, down;  // bf16 (layers without attention: no qkv, o; cross layers: q rows only)
  DeviceBuffer ln1, ln2;               // f32
  DeviceBuffer ln1_b, ln2_b;           // f32 LayerNorm biases (arch.h: NormKind::LayerNorm)
  DeviceBuffer qkv_b, o_b;             // f32 projection biases (arch.h: attn_bias)
  DeviceBuffer qkv_b16;                // qkv_b in bf16, for the qkv GEMM's epilogue (its output is bf16)
  DeviceBuffer act;                    // f32 {w0, w1, w2, b}: PolyNorm (arch.h)
  // Mamba-1 / GMU (model.h): bf16 in_proj [2 di or di, E], x_proj [R + 2S, di], dt_w [di, R], out_proj [E, di];
  // f32 conv_w [di, K], conv_b, dt_b, d_skip [di], a_neg [di, S] = -exp(A_log)
  DeviceBuffer in_proj, x_proj, dt_w, out_proj, conv_w, conv_b, dt_b, a_neg, d_skip;
};

struct Activations {
  int64_t cap = 0;  // tokens
  int64_t cap_n = 0;  // positions in cos_sin
  DeviceBuffer hidden, qkv_cache, scratch32, x, attn, act, ids, cos_sin;
  // SambaY: the scan's (or GMU's) gated output [T][di], the memory [T][di], x_proj's output [T][R + 2S] (bf16),
  // and the scan's workspace. in_proj's output [T][2 di] and dt [T][di] live in scratch32.
  DeviceBuffer ssm, memory, xdbl, scan_ws;
  // Host caches (backend_cuda_host_caches.cpp): hidden holds two stream slots and qkv_cache two Q/K/V slots, and every
  // layer's rows live here in pinned host memory: [L_block + 1][cap][E] f32 and [attention layers][cap][W] bf16.
  bool host = false;
  HostCacheBuffer host_hidden, host_qkv;
  size_t bytes() const {  // (device bytes)
    return hidden.bytes() + qkv_cache.bytes() + scratch32.bytes() + x.bytes() + attn.bytes() + act.bytes() +
           ids.bytes() + cos_sin.bytes() + ssm.bytes() + memory.bytes() + xdbl.bytes() + scan_ws.bytes();
  }
};

// A Mamba layer's decoding state: the conv's last K - 1 inputs [K - 1][di] bf16 (padded to 16 bytes), then the
// scan's h [di][S] f32.
inline size_t conv_state_bytes(const ModelConfig& c) {
  return (size_t(std::max<int64_t>(c.d_conv - 1, 0) * c.d_inner) * 2 + 15) / 16 * 16;
}
inline size_t mamba_state_bytes(const ModelConfig& c) {
  return conv_state_bytes(c) + size_t(c.d_inner * c.d_state) * 4;
}

// y[tokens, out_f] = x[tokens, in_f] w[out_f, in_f]^T + beta c, all row-major; bf16 inputs, f32 accumulation.
struct GemmArgs {
  int64_t out_f = 0, tokens = 0, in_f = 0;
  const bf16* w = nullptr;
  const bf16* x = nullptr;
  void* y = nullptr;
  bool y_f32 = false;     // y (and c) f32, else bf16
  float beta = 0.f;
  const void* c = nullptr;  // the beta term, laid out like y; nullptr: y itself (accumulate in place)
  // A bias added to every row in the GEMM's epilogue (cuBLASLt's EPILOGUE_BIAS): out_f values of y's type (bf16 or
  // f32, as cuBLASLt wants it), and the same values in f32 for the fallback's separate add.
  const void* bias = nullptr;
  const float* bias_f32 = nullptr;
  // Row strides in elements of x and of y (and c); 0: packed (in_f, out_f). The last layer's rows-only pass uses
  // them to pick one row per sequence out of the [batch][n] activations.
  int64_t ldx = 0, ldy = 0;
  // Device bytes the autotuner may overwrite. Only an in-place accumulation needs them (timing it on y would add
  // the product into y once per run); without enough, that shape keeps the heuristic's first choice until a call
  // that brings them.
  void* spare = nullptr;
  size_t spare_bytes = 0;
};

// What selects a GEMM's algorithm: the shape, the output type, whether C is read, and the operands' alignment
// (cuBLASLt's heuristic must not offer kernels that need more than the pointers have).
struct GemmKey {
  int64_t m = 0, n = 0, k = 0, ldb = 0, ldd = 0;
  bool d_f32 = false, accumulate = false, bias = false;
  uint32_t align_a = 0, align_b = 0, align_c = 0, align_d = 0;
  auto operator<=>(const GemmKey&) const = default;
};

// One shape's cuBLASLt descriptors and algorithm. lt false: cuBLASLt offered no algorithm, cublasGemmEx runs it.
struct GemmPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;  // C has D's layout
  cublasLtMatmulAlgo_t algo{};
  bool lt = false;
  bool tuned = false;                           // algo is final (timed, or autotuning is off)
  std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's, best first, until timed
  GemmPlan() = default;
  ~GemmPlan();
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;
};

// The attention overrides of the environment (README, "Choosing the attention kernel"); throws ds::Error naming
// a variable whose value it does not know.
kern::AttnOptions attn_options_from_env();

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device = 0);  // throws ds::Error
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override;
  std::string kind() const override { return "cuda"; }
  void load(const Model& model, const ProgressFn& progress) override;
  void forward(const ForwardRequest& req, ForwardResult& out) override;
  void layer_maps(int layer, LayerMaps& out) override;
  Profile profile() const override;
  int64_t max_tokens() const override;
  bool truncate(int64_t n) override;
  int64_t device_memory_used() const override;

  // --- beyond the interface
  std::vector<HeadStats> head_stats(int layer, std::optional<float> lambda = std::nullopt) override;
  void map_view(const ViewRequest& req, MapView& out) override;
  void mamba_view(const ViewRequest& req, MapView& out) override;
  void mamba_row(int layer, int channel, int64_t q, std::vector<float>& row) override;
  void map_rows(int layer, const std::vector<int64_t>& positions, MapRows& out) override;
  std::vector<RowMass> row_mass(int layer, int64_t q, int64_t a0, int64_t a1) override;
  std::vector<std::vector<RowMass>> row_masses(const std::vector<int>& layers, int64_t q, int64_t a0,
                                               int64_t a1) override;
  void set_profiling(bool on) { profiling_ = on; }
  // Random bf16 weights generated on the GPU (benchmarks): uniform with std 0.02, norms 1.
  void load_random(const ModelConfig& cfg, uint64_t seed);
  // `batch` sequences of n tokens each (ids [batch * n], host). Layers below from_layer reuse the previous
  // run's activations when the ids and shape are unchanged. With want_logits, leaves the logits of the last
  // position of every sequence in logits_dev() [batch, vocab]. last_rows_only: after the last layer's attention
  // only the last row of each sequence is carried on (o_proj, MLP: 1/L of the work when only next-token logits
  // are wanted); every layer's Q/K/V cache, hence every map, is still complete.
  void run(const int32_t* ids, int batch, int64_t n, const std::vector<float>& lambda, int from_layer,
           bool want_logits, bool last_rows_only = false);
  const float* logits_dev() const { return logits_.as<float>(); }
  // One decoding step of the last batch-1 run (backend_cuda_decode.cpp): token `id` at position last n, through
  // every layer over the cached K/V (and Mamba state), its rows written into the caches; leaves the new position's
  // logits in logits_dev(). lambda must be the one the cached positions ran with. After a first eager step the
  // step is captured in a CUDA graph (all its launches read the position from device memory) and replayed.
  void decode_step(int32_t id, const std::vector<float>& lambda);
  // The greedy choice of the logits in logits_dev() (one row), made on the device: 8 bytes to the host. Throws
  // ds::Error when no logit is finite, as the host's Sampler does.
  int32_t device_argmax();
  void fetch_logits(ForwardResult& out) override;
  bool queue_logprob(int32_t id, int slot) override;
  std::vector<double> take_logprobs(int count) override;
  void lens_logits(int layer, int64_t position, float* out) override;
  void outlier_counts(int layer, bool logits, const RadixPass& pass, std::vector<uint64_t>& counts) override;
  void outlier_counts_many(const std::vector<OutlierQuery>& q, std::vector<std::vector<uint64_t>>& counts,
                           OutlierValues* values) override;
  OutlierValues outlier_values_many(const std::vector<OutlierQuery>& q) override;
  bool outlier_hidden_select(HiddenSelection& out) override;
  std::vector<std::vector<float>> outlier_values(int layer, bool logits, const std::vector<float>& at_least,
                                                 size_t cap) override;
  // The stream leaving `layer` (every row of the last forward), the outlier passes' hidden states.
  const float* outlier_stream(int layer);
  // One outlier pass over a layer's logits (outlier_counts_many's counting with `collect`, or width 0: the collection
  // alone): kern::launch_logit_pass_sm90 where it runs (every pass of a layer takes the same path, so the passes
  // count the same values), else the batched GEMM's chunks of rows and kern::launch_outlier_count / _collect.
  void outlier_logit_pass(int layer, int shift, int width, const uint32_t* prefixes, int nprefix,
                          unsigned long long* counts, const kern::OutlierCollect& collect);
  // The cells the outlier passes read: the stream leaving `layer`, or each chunk of its logit rows (f per chunk).
  template <class F>
  void outlier_cells(int layer, bool logits, F&& f);
  DeviceBuffer outlier_buf_;  // the passes' counts, prefixes, thresholds and collected values
  // outlier_hidden_select's copies of the values its later passes read (an eighth of the hidden states at most);
  // released with the activations, and counted as free memory by max_tokens()
  DeviceBuffer outlier_compact_;
  DeviceBuffer logit_ptrs_;   // the batched logit GEMM's A, B and C pointers (outlier_cells)
  DeviceBuffer mean_slots_;   // the mean ablations' means (Ops::mean_columns): [64 slots][1024] f32
  void set_decode_graphs(bool on) { decode_graphs_ = on; }  // false: every step launched eagerly (tests compare)
  // true: steps run eagerly with every launch timed; build_profile() then gives the step's kernels (benchmarks).
  void set_decode_profile(bool on) { decode_profile_ = on; }
  // false: the step's projections through cuBLASLt instead of kernels/gemv.h (tests and benchmarks compare).
  void set_decode_gemv(bool on) {
    decode_gemv_ = on;
    if (dec_) dec_->warm = false;  // new shapes: one eager step (GEMM plans) before the next capture
    if (dec_ && dec_->graph) {
      cudaGraphExecDestroy(dec_->graph);
      dec_->graph = nullptr;
    }
  }
  int64_t decode_graph_replays() const { return graph_replays_; }
  // Hooks (forward.h) that run() and decode_step() call; null: none.
  void set_hooks(std::shared_ptr<const fwd::Hooks> h) { hooks_ = std::move(h); }
  // A layer split's block (engine/session/split_backend.h): layers [first, last) only.
  bool set_layer_range(int first, int last) override;
  void set_memory_limit(int64_t bytes) override { mem_limit_ = bytes > 0 ? size_t(bytes) : 0; }
  StreamRows stream_rows(int l, int64_t r0) const override;
  void write_stream(int l, int64_t r0, int64_t rows, const float* in) override;
  void read_stream(int l, int64_t r0, int64_t rows, float* out) override;
  int end_layer() const { return last_ < 0 ? int(cfg_.layers) : last_; }  // one past the block's last layer
  bool owns(int l) const { return l >= first_ && l < end_layer(); }
  std::vector<float> layer_max_abs() const override;
  // The GEMMs of run(ids, batch, n, ..., last_rows_only) alone, over the activations a run of that batch and n
  // left: the floor that a forward with these GEMMs cannot beat (benchmarks). Leaves no maps to query.
  void run_gemms_only(int batch, int64_t n, bool last_rows_only);
  // After a run() with profiling on (and the stream synchronised): fills profile() from its marks, as forward()
  // does for its own run. The benchmarks use it for batched runs.
  void build_profile(double wall_ms, int64_t tokens, int from_layer, int batch, int64_t n);
  double gemm_peak_tflops();  // the backend's bf16 GEMM path at 8192^3 on random data, measured once
  void sync();
  cudaStream_t stream() const { return stream_.get(); }
  int device() const { return device_; }
  // The attention kernel layer_forward runs for p (select_attn with this device and the options parsed at
  // construction); throws ds::Error when none can run it.
  kern::AttnChoice attn_choice(const kern::AttnParams& p) const;
  // Overrides for tests and benchmarks (the environment's DS_ATTN_* are read once, at construction).
  void set_attn_options(const kern::AttnOptions& o) { attn_opt_ = o; }
  const kern::AttnDevice& attn_device() const { return attn_dev_; }
  // Views pool with the fused two-pass kernel where it runs (default); false: the map kernels in chunks (tests and
  // benchmarks compare the two).
  void set_fused_views(bool on) { fused_views_ = on; }
  const ModelConfig& config() const { return cfg_; }
  size_t weight_bytes() const { return weight_bytes_; }
  const std::string& device_name() const { return device_name_; }

 private:
  class ForwardOps;  // the forward's operations on this backend (backend_cuda_ops.cpp)
  friend class ForwardOps;
  struct Mark {
    const char* name;
    int layer;
    size_t ev0, ev1;
  };
  // f() between two events recorded on the stream, kept as a profiler mark, when `on`; else f() alone. timed() is
  // the forward's (profiling_), the decode step has its own switch (eager steps only: no events inside a graph).
  // Calls between forwards (views, rows, statistics) add marks that the next forward clears unread; kMaxMarks
  // bounds them (and the events behind them) for a session that pans views for hours without a forward.
  static constexpr size_t kMaxMarks = 16384;  // (a forward makes a few per layer)
  template <class F>
  void timed_if(bool on, const char* name, int layer, F&& f) {
    if (!on || marks_.size() >= kMaxMarks) {
      f();
      return;
    }
    const size_t a = next_event();
    DS_CUDA_CHECK(cudaEventRecord(events_[a].get(), stream()));
    f();
    const size_t b = next_event();
    DS_CUDA_CHECK(cudaEventRecord(events_[b].get(), stream()));
    marks_.push_back({name, layer, a, b});
  }
  template <class F>
  void timed(const char* name, int layer, F&& f) {
    timed_if(profiling_, name, layer, std::forward<F>(f));
  }
  size_t next_event();
  void reset_model();
  // Activations for `tokens` rows of sequences of n, with room for `spare` more positions where memory allows.
  void ensure_activations(int64_t tokens, int64_t n, int64_t spare = 0);
  void make_activations(Activations& a, int64_t cap, int64_t cap_n, bool host) const;
  // --- host caches (backend_cuda_host_caches.cpp): a prompt whose streams and Q/K/V do not fit the device keeps
  // every layer's rows in pinned host memory. The forward fills two device slots of each (layer l: slot l & 1),
  // and after each layer a copy stream writes its rows back while the next layer runs; a reader pages a layer's rows
  // in again (page_stream, page_qkv) before it reads them. Only blocks of attention layers (no Mamba, no cross-layer
  // KV) take them; DS_HOST_CACHES=0 never, =1 always (tests), unset: when the device alone cannot hold the prompt.
  bool host_caches_possible() const;       // the model takes them and DS_HOST_CACHES does not forbid them
  // Positions the memory holds: the device's free memory for every layer's rows, or (host) for two slots of them and
  // the host's free memory for the rest.
  int64_t tokens_held(bool host) const;
  int64_t host_tokens() const;             // positions the host's free memory holds for the caches
  void hc_run_start(int from, int64_t rows);  // run(): the last forward's copies done, Stream(from) in its slot
  void hc_layer_begin(int l, bool decode);
  void hc_layer_end(int l, bool decode);
  void hc_decode_rows(int64_t pos);        // a decoding step's stream rows at `pos` into the host caches
  // Decoding: layers whose K and V rows stay on the device between steps, [cap][2 Hkv d] in the prompt's scratch
  // (scratch32, act, attn, x: idle while decoding, rewritten by the next prompt's forward): hc_decode_kv points the
  // step's attention at them (else the layer's slot, paged in each step), hc_decode_row_kv adds the step's row.
  void hc_decode_kv(int l, kern::AttnParams& p) const;
  void hc_decode_row_kv(int l);
  // After the main stream's work so far: Stream(l)'s rows (its slot) to the host on the copy stream, `done` then
  // recorded there
  void hc_write_back_stream(int l, const std::unique_ptr<CudaEvent>& done);
  void page_stream(int l) const;
  void page_qkv(int l) const;
  void hc_wait_copies() const;             // the host waits for every write-back (before reading the host rows)
  float* host_stream(int l) const;         // Stream(l)'s rows in the host caches
  int64_t hc_rows() const;                 // rows a layer holds: the last run's batch x n
  int host_caches_mode_ = -1;              // DS_HOST_CACHES: -1 auto, 0 off, 1 always
  struct HostCacheState {
    int stream_res[2] = {-1, -1};  // the stream each device slot holds (-1: none)
    int qkv_res[2] = {-1, -1};     // the layer whose Q/K/V each slot holds
    bool qkv_written = false;      // this layer's forward wrote its Q/K/V (a kept attention output does not)
    int64_t rows = 0;              // rows of this forward (batch x n)
    StreamPtr copy;                // the write-backs' stream
    std::vector<bf16*> kv_res;     // [L] decoding: the layer's K and V rows kept on the device (null: paged in)
    std::vector<uint8_t> kv_filled;
    int64_t kv_gen = -1;           // act_gen_ they were placed for (-1: a prompt's forward has used the scratch since)
    std::unique_ptr<CudaEvent> stream_done[2], qkv_done[2], layer_done, copies;
  };
  mutable HostCacheState hc_;
  void ensure_logits(int64_t rows);
  // The layers from `from` on (fwd::run_layers through ForwardOps) for `batch` sequences of n.
  void run_layers(int batch, int64_t n, const std::vector<float>& lambda, int from, bool last_rows_only,
                  bool gemms_only);
  // fwd::mamba_inputs of Mamba layer `layer` over the last forward's cached input (a batch-1 run of last_n_
  // positions), from a zero conv state: scratch32 holds [x | z] then dt, act u, xdbl [dt_raw | B | C].
  void run_mamba_inputs(int layer);
  // The decoding step's kernels for all layers and the logits (captured into the step's graph).
  void decode_launches();
  void grow_activations(int64_t need);  // room for `need` positions, keeping every cached row
  bf16* conv_state(int layer) const;    // Mamba layer's conv state [K - 1][di] bf16
  float* ssm_state(int layer) const;    // Mamba layer's scan state [di][S] f32
  // The block norm of the family (RMSNorm or LayerNorm) of `rows` f32 rows into bf16.
  void block_norm(const float* x, int64_t x_stride, const DeviceBuffer& w, const DeviceBuffer& b, bf16* y,
                  int64_t rows);
  // Layer l's attention over its cached Q (and its or kv_layer's K/V): window, KV source, lambda.
  kern::AttnParams layer_attn(int layer, int64_t n, int batch, float lambda) const;
  bf16* qkv_slot(int layer) const;  // layer's [cap][W] slice of qkv_cache (layers with attention only)
  void assign_qkv_slots();          // qkv_slot_ from cfg_
  // Final norm + LM head (fwd::logits) into logits_: every sequence's last row, or `count` rows from token `first`.
  void final_logits(int batch, int64_t n);
  void final_logits_rows(int64_t first, int64_t count);
  void compute_maps(int layer, LayerMaps* out, std::vector<HeadStats>* stats,
                    std::optional<float> lambda = std::nullopt);
  kern::AttnParams layer_params(int layer) const;  // the maps' view of a layer's cached Q/K (checks the layer)
  bool fused_map_queries(const kern::AttnParams& p) const;
  // A Mamba channel's implicit attention (mamba_view, mamba_row): its layer's scan inputs recomputed, the channel's
  // steps, and the operands of kern::launch_mamba_implicit_view.
  struct ImplicitInputs {
    const float* delta;
    const double* cum;
    const bf16 *B, *C;
    int64_t ld_bc;
    const float* A;
    int S;
  };
  ImplicitInputs implicit_inputs(int layer, int channel);
  void implicit_grid(const ImplicitInputs& in, const kern::ViewPoolArgs& va, float* grid);
  struct HostCopy {
    void* dst;  // pageable host memory
    const void* src;
    size_t bytes;
  };
  void copy_to_host(const std::vector<HostCopy>& copies);  // synchronous, through host_stage_
  // Runs g inside the profiler mark `name` (none when null). The shape's plan is made first, outside the mark:
  // the first call with a new shape times the candidates there (DS_GEMM_AUTOTUNE=0: heuristic's first choice).
  void gemm(const char* name, int layer, const GemmArgs& g);
  GemmPlan& gemm_plan(const GemmArgs& g);
  void gemm_tune(GemmPlan& p, const GemmArgs& g, void* d);
  void gemm_launch(const GemmPlan& p, const GemmArgs& g);
  void set_bias(const GemmPlan& p, const GemmArgs& g);
  int view_heads() const { return int(cfg_.view_heads()); }
  int64_t qkv_width() const { return (cfg_.heads + 2 * cfg_.kv_heads) * cfg_.head_dim; }
  size_t bytes_per_token(bool host = false) const;  // device bytes a position takes (host: with host caches)
  // Whether `bytes` more fit beside the activations (the device's free memory, --gpu-mem-limit) with the reserve left.
  bool has_spare(size_t bytes) const;

  int device_ = 0;
  std::string device_name_;
  // Owners first, so that they are destroyed last (after every buffer that uses the stream).
  StreamPtr stream_;
  CublasPtr blas_;   // only for shapes cuBLASLt has no algorithm for
  CublasLtPtr lt_;
  DeviceBuffer lt_ws_;              // cuBLASLt workspace (split-K partials and the like)
  bool autotune_ = true;            // DS_GEMM_AUTOTUNE=0 turns it off
  bool initcheck_mark_ = false;     // DS_CUDA_INITCHECK_MARK_GEMM=1: GEMM outputs zeroed first (gemm_launch)
  bool device_select_ = true;       // DS_OUTLIER_DEVICE_SELECT=0: outlier_hidden_select declines (A/B measurements)
  bool select_compact_ = true;      // DS_OUTLIER_COMPACT=0: its later passes read the whole hidden states (A/B)
  bool logit_pass_fused_ = true;    // DS_OUTLIER_LOGITS_FUSED=0: the logits' passes from the batched GEMM (A/B)
  bool fused_swiglu_ = true;        // DS_SWIGLU_FUSED=0: the gate/up GEMM and SwiGLU (and the GMU's in_proj and
                                    // gate) as two kernels on sm_90a too
  std::map<GemmKey, std::unique_ptr<GemmPlan>> gemm_plans_;
  bool loaded_ = false;
  kern::AttnDevice attn_dev_;  // what select_attn reads of this device, queried once
  kern::AttnOptions attn_opt_;  // DS_ATTN_KERNEL / _BN / _ORDER / _FIXMAX / _QUANT_ONE_KERNEL, parsed once
  ModelConfig cfg_;
  std::vector<LayerWeights> layers_;
  int first_ = 0, last_ = -1;  // set_layer_range (-1: to the last layer)
  size_t mem_limit_ = 0;         // set_memory_limit (0: none)
  size_t held_after_load_ = 0;   // device bytes the load took (weights and fixed buffers), under mem_limit_
  // The ForwardRequest's stream_in (a later block of a layer split), copied into Stream(first_) by run().
  const float* stream_in_ = nullptr;
  int stream_in_device_ = -1;
  float* stream_ptr(int l, int64_t row = 0) const;  // Stream(l)'s row `row` in hidden (first_ <= l <= end_layer())
  // bytes of stream_in_ to dst on this GPU: a peer copy from the previous block's GPU, or from the host
  void copy_stream_in(float* dst, size_t bytes);
  int qkv_slots_ = 0;          // layers of the block with attention (slices of qkv_cache)
  std::vector<int> qkv_slot_;  // [L]: index of the layer's slice of qkv_cache; -1 for layers without attention
  DeviceBuffer embed_, lm_head_, final_norm_, final_norm_b_, inv_freq_;
  const bf16* lm_head_ptr_ = nullptr;
  size_t weight_bytes_ = 0;
  Activations act_;
  DeviceBuffer logits_;       // [rows, vocab] f32
  DeviceBuffer xf_;           // [rows, E] bf16, final-normed rows for the lm_head
  DeviceBuffer map_buf_, map_stats_, view_buf_;
  DeviceBuffer implicit_buf_;  // mamba_view, mamba_row: one channel's steps [n] f32 and their prefix sums [n] f64
  bool fused_views_ = true;
  PinnedBuffer host_stage_;           // copy_to_host's staging (up to 64 MB)
  std::vector<CudaEvent> stage_ev_;
  DeviceBuffer stats_sum_;    // [view heads][MAP_NSTAT] f64: head_stats' device reduction
  DeviceBuffer head_ns_;      // [L][view heads] u64
  // last run
  bool has_run_ = false;
  // A layer's attention output kept across bulk re-runs (ForwardRequest::keep_attention, fwd::Ops::keep_attention):
  // valid while no forward re-runs a layer below it or changes the ids, n or the activations.
  struct KeptAttention {
    int layer = -1;
    int64_t n = 0, gen = -1;
    float lambda = 0;
    fwd::AttnEdit edit;
    bool valid = false;
    DeviceBuffer buf;
  } kept_;
  int keep_req_ = -1;  // this forward's ForwardRequest::keep_attention
  int run_from_ = -1;  // the first layer this forward runs
  bool partial_last_layer_ = false;  // hidden[L] holds only the last row of each sequence
  bool last_row_stale_ = false;      // truncate() cut the sequence: hidden[L]'s last row may be an older lambda's
  int64_t act_gen_ = 0;              // bumped whenever act_ is reallocated (a captured decoding graph is then stale)
  int64_t rope_n_ = 0;               // positions cos_sin holds
  // decoding (backend_cuda_decode.cpp)
  struct Decoder {
    DeviceBuffer ctl;        // int32 {token, position, length} the step's launches read
    DeviceBuffer h;          // [L + 1][E] f32: the step's residual stream (row l: input of layer l)
    DeviceBuffer x, qkv, attn, gu, act, spare, attn_ws;      // one row each (bf16), attention workspace
    DeviceBuffer xz, u, xdbl, dt, mem, yg;                   // Mamba / GMU rows
    DeviceBuffer pick;                                       // int32 {argmax, its value's bits}
    PinnedBuffer pick_host;                                  // where the pick lands on the host
    size_t attn_ws_len = 0;  // max_len the attention workspace is sized for
    cudaGraphExec_t graph = nullptr;
    int64_t graph_gen = -1;  // act_gen_ the graph was captured against
    std::vector<float> graph_lambda;
    const fwd::Hooks* graph_hooks = nullptr;  // the hooks the graph was captured with
    const void* graph_edits = nullptr;        // ... and the attention edits (knockout spans are kernel arguments)
    bool warm = false;       // an eager step ran since the GEMM shapes or the buffers last changed
    Decoder() = default;
    Decoder(const Decoder&) = delete;
    Decoder& operator=(const Decoder&) = delete;
    ~Decoder() {
      if (graph) cudaGraphExecDestroy(graph);
    }
  };
  std::unique_ptr<Decoder> dec_;
  bool decode_graphs_ = true;
  bool decode_profile_ = false;
  bool decode_gemv_ = true;  // the step's projections through kernels/gemv.h (DS_DECODE_GEMV=0: cuBLASLt)
  int64_t graph_replays_ = 0;
  std::shared_ptr<const fwd::Hooks> hooks_;  // the forward's hook points (forward.h)
  // The attention op's edits of the last forward (forward.h AttnEdit; null: none), and their head coefficients on the
  // device: [L][view heads] float2 (c1, c2), uploaded when they change (upload_head_coefs); has_coef_[l]: layer l
  // reads them.
  std::shared_ptr<const std::vector<fwd::AttnEdit>> edits_;
  DeviceBuffer head_coef_;
  DeviceBuffer logprob_slots_;  // [kLogprobSlots] f64: queue_logprob's values
  DeviceBuffer last_row_ws_, last_row_len_;  // a prompt's last-row attention (the decoding kernel): workspace, n
  std::vector<float> head_coef_host_;
  std::vector<uint8_t> has_coef_;
  void upload_head_coefs(const std::vector<float>& lambda);
  DeviceBuffer max_abs_;                     // [L] f32: the max_abs readers' slots
  std::vector<uint8_t> max_abs_read_;        // [L]: whether a reader filled the slot since it was reset
  DeviceBuffer mamba_state_;         // [Mamba layers]: conv state [K - 1][di] bf16, then scan state [di][S] f32
  std::vector<int> mamba_slot_;      // [L]: index into mamba_state_, -1 for other layers
  std::vector<int32_t> last_ids_;
  std::vector<float> last_lambda_;
  int last_batch_ = 0;
  int64_t last_n_ = 0;
  // profiling
  bool profiling_ = true;
  std::vector<CudaEvent> events_;
  size_t events_used_ = 0;
  std::vector<Mark> marks_;
  Profile profile_;
  mutable double peak_tflops_ = 0;
};

CudaBackend& as_cuda(Backend& b);

// Streams tensors to the device as bf16 through two pinned staging buffers (host conversion overlaps the copy).
class WeightUploader {
 public:
  WeightUploader(cudaStream_t stream, const ProgressFn& progress, size_t total_bytes);
  // Converts t (F32/F16/BF16/F64) to bf16 at dst (device), numel(t) elements.
  void to_bf16(const TensorInfo& t, bf16* dst);
  // The same for a host f32 array (a tensor the family's layout transformed: Model::layer_weight_f32).
  void to_bf16(const std::vector<float>& host, bf16* dst, const std::string& name);
  void finish();

 private:
  cudaStream_t stream_;
  ProgressFn progress_;
  size_t total_ = 0, done_ = 0;
  static constexpr size_t kChunk = size_t(8) << 20;  // elements per staging buffer (16 MB of bf16)
  PinnedBuffer stage_[2];
  CudaEvent free_[2];
  int cur_ = 0;
  std::vector<uint8_t> raw_;
};

}  // namespace ds::cuda
